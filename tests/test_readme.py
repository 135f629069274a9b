"""The README's runnable examples run as pasted (each marked ``<!-- example: NAME -->``)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
EXAMPLES = dict(
    re.findall(r"<!-- example: ([\w-]+) -->\n```python\n(.*?)```", README.read_text(), re.S)
)


def test_the_examples_are_found() -> None:
    assert set(EXAMPLES) == {"own-loop", "from-opacus", "audit-own-loop", "keras-fit"}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs_as_pasted(name: str, tmp_path: Path) -> None:
    here = Path.cwd()
    os.chdir(tmp_path)  # examples may write files (privacy.json)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(EXAMPLES[name], f"README example {name}", "exec"), {"__name__": "readme"})
    finally:
        os.chdir(here)
    if name == "audit-own-loop":
        _check_the_audit_examples_sentence(printed.getvalue())


def _check_the_audit_examples_sentence(printed: str) -> None:
    """The sentence after the audit example states what it prints (rows, verdicts, bounds)."""
    rows = dict(re.findall(r"^\s*(\w+): (.*)$", printed, re.M))
    assert len(rows) == 9 and all(v.startswith("consistent") for v in rows.values()), printed
    after = README.read_text().split("<!-- example: audit-own-loop -->", 1)[1]
    sentence = after.split("```", 2)[2].lstrip("\n").split("\n\n", 1)[0]
    assert sentence.strip().startswith("It prints nine `consistent` rows"), sentence
    per_step = re.search(r"ε_lb (\d+\.\d\d)", rows["whitebox_per_step"])
    one_run = re.search(r"ε_lb (\d+\.\d\d)", rows["one_run"])
    assert per_step is not None and one_run is not None, printed
    assert f"per-step ε_lb {per_step.group(1)} against" in " ".join(sentence.split())
    assert f"one-run ε_lb {one_run.group(1)} against" in " ".join(sentence.split())


def test_torchrun_example_runs_as_pasted(tmp_path: Path) -> None:
    block = re.search(r"<!-- example: torchrun -->\n```bash\n(.*?)```", README.read_text(), re.S)
    assert block is not None
    script = re.search(r"<<'EOF'\n(.*?)\nEOF\n", block.group(1), re.S)
    assert (
        script is not None
        and "torchrun --standalone --nproc-per-node 2 ddp_example.py" in block.group(1)
    )
    (tmp_path / "ddp_example.py").write_text(script.group(1) + "\n")
    completed = subprocess.run(
        # --standalone: a free port for the rendezvous, not the fixed 29500 another job may hold
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "ddp_example.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = completed.stdout.strip().splitlines()[-1]
    # the accounting is deterministic; the accuracy may differ in its last digit across CPUs
    assert re.fullmatch(
        r"2 ranks, 200 steps: train accuracy 0\.9\d\d, epsilon 4\.77 \(delta = 1e-5\)", line
    ), line
