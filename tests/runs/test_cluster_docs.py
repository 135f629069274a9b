"""docs/cluster.md: every code block is run or checked.

Each fenced block is tagged by the comment line before it: ``run`` blocks run here, in order, in
one namespace, in a temporary folder; ``engines`` blocks run with Ray and submitit (``nox -s
engines``); ``compile`` blocks need a real cluster: they compile and their executor names parse
(the Slurm one also runs on submitit's in-process ``debug`` cluster, under ``engines``, which
checks its parameter names); ``shell`` blocks name extras that exist and executors that parse.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import tomllib

from dpcore.runs import open_executor, parse_executor

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "cluster.md"
BLOCK = re.compile(r"<!-- test: (\w+) -->\n```(\w+)\n(.*?)```", re.DOTALL)
EXECUTOR = re.compile(r'(?:executor=|open_executor\(\s*)"([^"]+)"|--executor ([^\s"]+)')


def blocks(tag: str | None = None) -> list[tuple[str, str, str]]:
    found = BLOCK.findall(DOC.read_text())
    return [block for block in found if tag is None or block[0] == tag]


def test_every_block_is_tagged_and_checked() -> None:
    text = DOC.read_text()
    assert text.count("```") == 2 * len(blocks())  # no untagged block
    tags = {tag for tag, _, _ in blocks()}
    assert tags == {"run", "engines", "compile", "shell"}
    for tag, language, _ in blocks():
        assert language == ("bash" if tag == "shell" else "python"), tag


def run_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *tags: str) -> dict[str, Any]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # spawned workers import dpcore from here
    namespace: dict[str, Any] = {"__name__": "cluster_docs"}
    for tag, _, code in blocks():
        if tag in tags:
            exec(compile(code, str(DOC), "exec"), namespace)
    return namespace


@pytest.mark.filterwarnings("ignore:Port 8787 is already in use")
def test_local_blocks_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = run_blocks(tmp_path, monkeypatch, "run")
    estimate = float(capsys.readouterr().out.split()[-1])
    assert abs(estimate - 3.14159) < 0.02
    store = namespace["store"]
    assert all(store.has(spec) for spec in namespace["specs"])
    assert len(list(Path("runs").iterdir())) == 12 + 4  # 12 runs, 4 resumable ones
    dask_runs = {p.name: (p / "result.json").read_bytes() for p in Path("runs-dask").iterdir()}
    assert dask_runs == {
        store.folder(spec).name: (store.folder(spec) / "result.json").read_bytes()
        for spec in namespace["specs"]
    }


def test_cluster_blocks_compile_and_name_valid_executors() -> None:
    named: list[str] = []
    for tag, _, code in blocks():
        if tag != "shell":
            compile(code, str(DOC), "exec")
        named += [quoted or bare for quoted, bare in EXECUTOR.findall(code)]
    assert {parse_executor(text).kind for text in named} == {
        "processes",
        "dask",
        "ray",
        "slurm",
    }
    assert "tcp://head:8786" in {parse_executor(text).address for text in named}


def test_shell_blocks_install_extras_that_exist() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    installed = [
        extra for _, _, code in blocks("shell") for extra in re.findall(r"dpcore\[(\w+)\]", code)
    ]
    assert sorted(installed) == ["dask", "ray", "slurm"]
    assert set(installed) <= set(extras)


@pytest.mark.engines
def test_engine_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    namespace = run_blocks(tmp_path, monkeypatch, "run", "engines")
    slurm = next(code for _, _, code in blocks("compile") if '"slurm"' in code)

    def debug_cluster(executor: str, **options: Any) -> Any:
        return open_executor(executor, **{**options, "cluster": "debug"})

    exec(compile(slurm, str(DOC), "exec"), {**namespace, "open_executor": debug_cluster})
    assert all(namespace["store"].has(spec) for spec in namespace["specs"])


def test_shell_blocks_show_the_reproductions_and_benchmarks_fanning_out() -> None:
    lines = {line.strip() for _, _, code in blocks("shell") for line in code.splitlines()}
    commands = {
        "nox -s reproduce -- --executor processes:2": "processes",
        "nox -s bench -- --executor dask": "dask",
    }
    for command, kind in commands.items():
        assert command in lines, command
        assert parse_executor(command.split()[-1]).kind == kind
