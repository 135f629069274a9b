"""Readers and the fetcher on corrupt files: a typed error, never another exception.

Allowed: :class:`DataFormatError` (a file in the wrong format), :class:`DataUnavailableError`
(a cached package that cannot be used) and :class:`InvalidParameterError` (bad arguments). All
files live in a temporary cache (``DPCORE_DATA_DIR``); nothing is downloaded.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import pickle
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpcore.data import DataFormatError, DataUnavailableError, unit_rows
from dpcore.data.datasets import read_movielens_inter
from dpcore.data.fetch import Source, fetch
from dpcore.data.formats import read_cifar_batch, read_idx, read_imdb_reviews, read_uci_adult
from dpcore.data.text import build_vocabulary, encode, tokenize
from dpcore.errors import InvalidParameterError
from tests.data.test_fetch import _deb, _tgz

ALLOWED = (DataFormatError, DataUnavailableError, InvalidParameterError)


def _idx(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


GOOD_IDX = _idx(np.arange(24).reshape(2, 3, 4))
ADULT_ROW = b"39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, "
ADULT_ROW += b"White, Male, 2174, 0, 40, United-States, <=50K\n"
GOOD_FILES = {
    "idx": GOOD_IDX,
    "idx.gz": gzip.compress(GOOD_IDX),
    "json": json.dumps([{"t": "good", "s": 1}, {"t": "bad", "s": 0}]).encode(),
    "adult": ADULT_ROW,
    "cifar": pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [1, 2]}),
    "inter": b"user_id:token\titem_id:token\trating:float\ttimestamp:float\n1\t2\t3\t4\n",
}


def corruptions(good: bytes) -> st.SearchStrategy[bytes]:
    """Truncations, flipped bytes, insertions and random bytes of a valid file."""
    cut = st.integers(0, len(good)).map(lambda n: good[:n])
    flip = st.tuples(st.integers(0, len(good) - 1), st.integers(0, 255)).map(
        lambda p: good[: p[0]] + bytes([p[1]]) + good[p[0] + 1 :]
    )
    grow = st.tuples(st.integers(0, len(good)), st.binary(max_size=8)).map(
        lambda p: good[: p[0]] + p[1] + good[p[0] :]
    )
    return st.one_of(cut, flip, grow, st.binary(max_size=64), st.just(good))


def read(kind: str, path: Path) -> Any:
    readers = {
        "idx": read_idx,
        "idx.gz": read_idx,
        "json": read_imdb_reviews,
        "adult": read_uci_adult,
        "cifar": read_cifar_batch,
        "inter": read_movielens_inter,
    }
    return readers[kind](path)


def reader_property(tmp_path: Path, kind: str, blob: bytes) -> None:
    path = tmp_path / ("file.gz" if kind == "idx.gz" else "file")
    path.write_bytes(blob)
    try:
        result = read(kind, path)
    except ALLOWED:
        return
    if kind.startswith("idx"):
        assert result.dtype == np.uint8
    elif kind == "cifar":
        assert result[0].shape[1:] == (3, 32, 32) and result[1].shape == (result[0].shape[0],)
        assert np.all((result[1] >= 0) & (result[1] <= 9))
    elif kind in ("json", "adult"):
        assert set(np.unique(result[1]).tolist()) <= {0, 1}


def _whl(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for name, data in members.items():
            bundle.writestr(name, data)
    return buffer.getvalue()


PACKAGES = {
    "tgz": ("npm", "x-1.0.tgz", _tgz({"package/a": b"alpha"})),
    "whl": ("pypi", "x-1.0-py3-none-any.whl", _whl({"package/a": b"alpha"})),
    "deb": ("debian", "x_1.0_all.deb", _deb({"package/a": b"alpha"})),
}


def fetch_property(root: Path, kind: str, blob: bytes) -> None:
    """A cached package whose pinned sha256 matches a corrupt file (the pin itself is wrong)."""
    registry, filename, _ = PACKAGES[kind]
    source = Source(
        registry, "x", "1.0", filename, hashlib.sha256(blob).hexdigest(), {"a": "package/a"}
    )
    archives = root / "archives"
    archives.mkdir(parents=True, exist_ok=True)
    (archives / filename).write_bytes(blob)
    for leftover in (root / "x", root / "x.partial"):
        if leftover.exists():
            for child in leftover.iterdir():
                child.unlink()
            leftover.rmdir()
    try:
        folder = fetch("x", sources={"x": source})
    except ALLOWED:
        return
    assert (folder / "a").read_bytes() == b"alpha"


def _bind(prop: Callable[[Path, str, bytes], None], root: Path, kind: str) -> Any:
    def check(blob: bytes) -> None:
        prop(root, kind, blob)

    return check


def run_readers(tmp_path: Path, examples: int) -> None:
    budget = settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    for kind, good in GOOD_FILES.items():
        budget(given(corruptions(good))(_bind(reader_property, tmp_path, kind)))()


def run_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, examples: int) -> None:
    monkeypatch.setenv("DPCORE_DATA_DIR", str(tmp_path))
    budget = settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    for kind, (_, _, good) in PACKAGES.items():
        budget(given(corruptions(good))(_bind(fetch_property, tmp_path, kind)))()


def text_property(texts: Any, vocab_size: Any, length: Any) -> None:
    try:
        vocabulary = build_vocabulary(texts, vocab_size)
        ids = encode(texts, vocabulary, length)
    except InvalidParameterError:
        return
    assert ids.shape == (len(texts), length) and np.all((ids >= 0) & (ids < vocabulary.size))


TEXTS = st.one_of(
    st.lists(st.text(max_size=20), max_size=4),
    st.sampled_from(["abc", None, [b"bytes"], [1, 2], ["ok", None]]),
)


def test_readers_on_corrupt_files(tmp_path: Path) -> None:
    run_readers(tmp_path, 25)


def test_fetch_on_corrupt_cached_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_fetch(tmp_path, monkeypatch, 15)


def test_text_functions_on_any_input() -> None:
    settings(max_examples=50, deadline=None)(
        given(
            TEXTS,
            st.sampled_from([3, 10, 2, 10**18, True, 3.0]),
            st.sampled_from([1, 5, 0, 10**18]),
        )(text_property)
    )()


@pytest.mark.slow
def test_robustness_wide_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_readers(tmp_path, 2000)
    run_fetch(tmp_path, monkeypatch, 500)


# --- regressions --------------------------------------------------------------------------


def test_idx_header_shorter_than_its_dimensions_is_a_format_error(tmp_path: Path) -> None:
    # ndim = 3 with 2 size bytes: np.frombuffer raised a bare ValueError.
    (tmp_path / "f").write_bytes(bytes([0, 0, 8, 3, 0, 0]))
    with pytest.raises(DataFormatError, match="header"):
        read_idx(tmp_path / "f")


def test_idx_with_zero_dimensions_is_a_format_error(tmp_path: Path) -> None:
    # ndim = 0: reshape of an empty body to () raised a bare ValueError.
    (tmp_path / "f").write_bytes(bytes([0, 0, 8, 0]))
    with pytest.raises(DataFormatError):
        read_idx(tmp_path / "f")


def test_idx_with_a_huge_header_shape_is_a_format_error(tmp_path: Path) -> None:
    # np.prod wrapped around in int64 for sizes whose product exceeds 2^63.
    header = bytes([0, 0, 8, 3]) + struct.pack(">3I", 2**32 - 1, 2**32 - 1, 2**32 - 1)
    (tmp_path / "f").write_bytes(header)
    with pytest.raises(DataFormatError, match="header says"):
        read_idx(tmp_path / "f")


def test_truncated_gzip_idx_is_a_format_error(tmp_path: Path) -> None:
    # gzip raised EOFError (truncated) or BadGzipFile (not gzip).
    (tmp_path / "t.gz").write_bytes(gzip.compress(GOOD_IDX)[:-6])
    (tmp_path / "r.gz").write_bytes(b"not gzip at all")
    for name in ("t.gz", "r.gz"):
        with pytest.raises(DataFormatError):
            read_idx(tmp_path / name)


@pytest.mark.parametrize(
    "content",
    [
        b'[{"t": "x", "s": "abc"}]',
        b'[{"t": "x", "s": Infinity}]',
        b'[{"t": "x", "s": NaN}]',
        b"\xff",
    ],
)
def test_imdb_reviews_with_bad_labels_or_bytes(tmp_path: Path, content: bytes) -> None:
    # int("abc") / int(inf) / int(nan) escaped as ValueError / OverflowError; bad UTF-8 as
    # UnicodeDecodeError.
    (tmp_path / "r.json").write_bytes(content)
    with pytest.raises(DataFormatError):
        read_imdb_reviews(tmp_path / "r.json")


def test_adult_with_invalid_utf8_is_a_format_error(tmp_path: Path) -> None:
    (tmp_path / "adult.data").write_bytes(b"\xff\xfe" + ADULT_ROW)
    with pytest.raises(DataFormatError):
        read_uci_adult(tmp_path / "adult.data")


@pytest.mark.parametrize(
    "batch",
    [
        {b"data": [[300] * 3072], b"labels": [0]},  # OverflowError casting to uint8
        {b"data": np.zeros((1, 3072), np.uint8), b"labels": [11]},  # label outside 0 ... 9
        [1, 2, 3],  # not a dict
    ],
)
def test_cifar_batch_with_wrong_content(tmp_path: Path, batch: object) -> None:
    (tmp_path / "b").write_bytes(pickle.dumps(batch))
    with pytest.raises(DataFormatError):
        read_cifar_batch(tmp_path / "b")


def test_cifar_batch_refuses_to_run_code(tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("unpickled code ran",))

    (tmp_path / "b").write_bytes(pickle.dumps({b"data": Payload(), b"labels": []}))
    with pytest.raises(DataFormatError, match="unexpected object"):
        read_cifar_batch(tmp_path / "b")


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"user_id\titem_id\trating\ttimestamp\n1\t2\n",
        b"user_id\titem_id\trating\ttimestamp\n1\t2\tx\t4\n",
    ],
)
def test_movielens_file_that_is_empty_or_ragged(tmp_path: Path, content: bytes) -> None:
    # An empty file raised IndexError; a short or non-numeric row a bare ValueError.
    (tmp_path / "ml.inter").write_bytes(content)
    with pytest.raises(DataFormatError):
        read_movielens_inter(tmp_path / "ml.inter")


@pytest.mark.parametrize(
    "blob",
    [
        PACKAGES["deb"][2][:56] + b"XX" + PACKAGES["deb"][2][58:],  # size field not a number
        b"!<arch>\n" + b"data.tar.gz/".ljust(48) + b"99999".ljust(10) + b"`\n" + b"garbage",
        b"!<arch>\n",  # no data.tar member
    ],
)
def test_corrupt_deb_is_data_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blob: bytes
) -> None:
    # A non-numeric size field raised a bare ValueError; a size beyond the file or garbage
    # inside data.tar a tarfile.ReadError.
    monkeypatch.setenv("DPCORE_DATA_DIR", str(tmp_path))
    source = Source("debian", "x", "1.0", "x.deb", hashlib.sha256(blob).hexdigest(), {"a": "a"})
    (tmp_path / "archives").mkdir()
    (tmp_path / "archives" / "x.deb").write_bytes(blob)
    with pytest.raises(DataUnavailableError):
        fetch("x", sources={"x": source})


def test_corrupt_gzip_stream_in_a_package_is_not_extracted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tarfile stops before the gzip CRC: a flipped byte extracted b"\0\0\0\0\0" for b"alpha".
    monkeypatch.setenv("DPCORE_DATA_DIR", str(tmp_path))
    good = PACKAGES["tgz"][2]
    fetch_property(tmp_path, "tgz", good[:79] + b"\0" + good[80:])


def test_fetch_with_a_non_string_name() -> None:
    with pytest.raises(DataUnavailableError):
        fetch(["mnist"])  # type: ignore[arg-type]


def test_unit_rows_of_1e300_has_norm_one() -> None:
    # The norm overflowed to inf and the row became 0.
    rows = unit_rows(np.array([[1e300, 1e300], [5e-324, 5e-324]]))
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0)


def test_text_functions_name_bad_arguments() -> None:
    with pytest.raises(InvalidParameterError, match="text"):
        tokenize(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="texts"):
        build_vocabulary(["ok", 3], 5)  # type: ignore[list-item]
    with pytest.raises(InvalidParameterError, match="Expected length small enough"):
        encode(["a"], build_vocabulary(["a"], 3), 10**18)


def test_wheel_with_an_inserted_byte_is_data_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # zipfile raised OSError (a seek before the file start); other corrupt flags raise
    # NotImplementedError or RuntimeError ("encrypted").
    monkeypatch.setenv("DPCORE_DATA_DIR", str(tmp_path))
    good = PACKAGES["whl"][2]
    fetch_property(tmp_path, "whl", good[:112] + b"\0" + good[112:])
