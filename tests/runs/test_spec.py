"""Specs: frozen dataclasses of JSON values, keyed the same way in every process; fingerprints."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dpcore.errors import InvalidParameterError
from dpcore.runs import code_fingerprint, spec_json, spec_key
from dpcore.runs.example import ExampleSpec
from dpcore.runs.spec import check_code, check_spec
from tests.runs.workloads import Spec


@dataclasses.dataclass(frozen=True)
class Other:
    index: int
    size: int = 4
    seconds: float = 0.0
    kill_once: bool = False


@dataclasses.dataclass(frozen=True)
class Nested:
    inner: ExampleSpec
    sizes: tuple[int, ...] = (1, 2)
    options: Any = None


@dataclasses.dataclass
class Mutable:
    seed: int


def test_keys_are_fixed_across_processes_and_versions() -> None:
    """The key is part of every stored folder name: it must never drift."""
    assert spec_key(ExampleSpec(0)) == "28a2bd9209bdcb12"
    program = "from dpcore.runs.example import ExampleSpec as S; from dpcore.runs import spec_key;"
    program += "print(spec_key(S(0)))"
    child = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    assert child.stdout.strip() == "28a2bd9209bdcb12"


def test_keys_separate_values_and_spec_types() -> None:
    assert spec_key(Spec(0)) == spec_key(Spec(0))
    assert len({spec_key(Spec(0)), spec_key(Spec(1)), spec_key(Spec(0, size=5))}) == 3
    assert spec_key(Spec(0)) != spec_key(Other(0))  # same fields, another kind of run
    nested = Nested(ExampleSpec(1), options=("b", (1.5, None)))
    assert spec_json(nested) == {
        "type": "Nested",
        "fields": {
            "inner": {"chunk": 100, "seed": 1, "steps": 1000},
            "options": ["b", [1.5, None]],
            "sizes": [1, 2],
        },
    }
    assert spec_key(nested) != spec_key(Nested(ExampleSpec(1), sizes=(2, 1)))


@pytest.mark.parametrize(
    ("spec", "constraint"),
    [
        ({"seed": 0}, "frozen dataclass"),
        (ExampleSpec, "frozen dataclass"),
        (Mutable(0), "frozen dataclass"),
        (Nested(ExampleSpec(0), options=[1, 2]), "hashable"),
        (Nested(ExampleSpec(0), options=math.nan), "JSON values"),
        (Nested(ExampleSpec(0), options=frozenset({1})), "JSON values"),
        (Nested(ExampleSpec(0), options=Path("/x")), "JSON values"),
    ],
)
def test_specs_that_cannot_name_a_run_raise(spec: object, constraint: str) -> None:
    with pytest.raises(InvalidParameterError, match=constraint) as raised:
        check_spec(spec)
    assert raised.value.parameter == "spec"
    with pytest.raises(InvalidParameterError):
        spec_key(spec)


def test_code_fingerprint_follows_the_source(tmp_path: Path) -> None:
    source = tmp_path / "workload.py"
    source.write_text("x = 1\n")
    first = code_fingerprint(source)
    assert first == code_fingerprint(source) and len(first) == 16
    source.write_text("x = 2\n")
    assert code_fingerprint(source) != first
    assert code_fingerprint(source, extra="torch 2.5") != code_fingerprint(source)
    assert code_fingerprint("tests.runs.workloads") == code_fingerprint(
        Path("tests/runs/workloads.py")
    )
    check_code(first)


def test_a_package_fingerprint_follows_every_module_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "fingerprinted_pkg"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("")
    noise = package / "inner" / "noise.py"
    noise.write_text("SCALE = 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = code_fingerprint("fingerprinted_pkg")
    noise.write_text("SCALE = 2.0\n")  # a module the package's __init__ never mentions
    second = code_fingerprint("fingerprinted_pkg")
    assert second != first
    noise.rename(package / "inner" / "noise2.py")  # same bytes, another module
    third = code_fingerprint("fingerprinted_pkg")
    assert third != second
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"compiled")
    (package / "notes.txt").write_text("not code")
    assert code_fingerprint("fingerprinted_pkg") == third  # only the .py sources count


@pytest.mark.parametrize(
    "sources", [(), ("dpcore.no_such_module",), (Path("/no/such/file.py"),), (sys,)]
)
def test_code_fingerprint_of_nothing_readable_raises(sources: tuple[Any, ...]) -> None:
    with pytest.raises(InvalidParameterError) as raised:
        code_fingerprint(*sources)
    assert raised.value.parameter == "sources"


@pytest.mark.parametrize("code", ["", "a/b", ".hidden", "x" * 65, "a b", 3, "é"])
def test_codes_that_cannot_be_part_of_a_folder_name_raise(code: Any) -> None:
    with pytest.raises(InvalidParameterError) as raised:
        check_code(code)
    assert raised.value.parameter == "code"
