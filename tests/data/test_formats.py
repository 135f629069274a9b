"""Readers on small files written in the real formats."""

from __future__ import annotations

import gzip
import json
import pickle
import struct

import numpy as np
import pytest

from dpcore.data.formats import (
    DataFormatError,
    read_cifar_batch,
    read_idx,
    read_imdb_reviews,
    read_uci_adult,
)


def _idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


@pytest.mark.parametrize("compressed", [False, True])
def test_idx_round_trip(tmp_path, compressed: bool) -> None:  # type: ignore[no-untyped-def]
    images = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    path = tmp_path / ("images.gz" if compressed else "images")
    data = _idx_bytes(images)
    path.write_bytes(gzip.compress(data) if compressed else data)
    assert np.array_equal(read_idx(path), images)
    assert read_idx(path).flags.writeable  # torch.from_numpy warns on read-only arrays


def test_idx_rejects_truncated_and_wrong_magic(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "short").write_bytes(_idx_bytes(np.zeros((3, 2)))[:-1])
    with pytest.raises(DataFormatError, match="header says"):
        read_idx(tmp_path / "short")
    (tmp_path / "float").write_bytes(bytes([0, 0, 0x0D, 1, 0, 0, 0, 0]))
    with pytest.raises(DataFormatError, match="magic"):
        read_idx(tmp_path / "float")


def test_imdb_reviews(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "reviews.json"
    path.write_text(json.dumps([{"t": "great<br />film", "s": 1}, {"t": "dull", "s": 0}]))
    texts, labels = read_imdb_reviews(path)
    assert texts == ["great<br />film", "dull"] and labels.tolist() == [1, 0]
    path.write_text(json.dumps([{"text": "x"}]))
    with pytest.raises(DataFormatError):
        read_imdb_reviews(path)


def test_uci_adult_train_and_test_layouts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    row = (
        "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, "
        "White, Male, 2174, 0, 40, United-States"
    )
    (tmp_path / "adult.data").write_text(f"{row}, <=50K\n{row}, >50K\n\n")
    (tmp_path / "adult.test").write_text(f"|1x3 Cross validator\n{row}, >50K.\n")
    rows, labels = read_uci_adult(tmp_path / "adult.data")
    assert len(rows) == 2 and rows[0][1] == "State-gov" and labels.tolist() == [0, 1]
    assert read_uci_adult(tmp_path / "adult.test")[1].tolist() == [1]
    (tmp_path / "bad").write_text(f"{row}, maybe\n")
    with pytest.raises(DataFormatError, match="label"):
        read_uci_adult(tmp_path / "bad")


def test_cifar_batch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = np.arange(4 * 3072, dtype=np.int64).astype(np.uint8).reshape(4, 3072)
    with (tmp_path / "data_batch_1").open("wb") as handle:
        pickle.dump({b"data": data, b"labels": [0, 1, 2, 3]}, handle)
    images, labels = read_cifar_batch(tmp_path / "data_batch_1")
    assert images.shape == (4, 3, 32, 32) and labels.tolist() == [0, 1, 2, 3]
    assert images[0, 0, 0, 1] == data[0, 1]
    (tmp_path / "junk").write_bytes(b"not a pickle")
    with pytest.raises(DataFormatError):
        read_cifar_batch(tmp_path / "junk")
