"""The README front page and the guide's runnable examples.

Every block marked ``<!-- example: NAME -->`` in README.md and in the guide's pages
(``docs/guide/*.md``) runs as pasted: the Python blocks in this process, the ``torchrun`` block
through ``torchrun``. The README stays a front page: at most 10 KB, the CI's test command, links
that resolve, and headlines that are what the writers write from the committed results.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"
#: The largest the front page may be, in bytes.
README_LIMIT = 10_000
#: A marked example: its name, the language of its fenced block, and the block's code.
EXAMPLE = re.compile(r"<!-- example: ([\w-]+) -->\n```(python|bash)\n(.*?)```", re.S)
#: Where each example lives (paths relative to the repository root).
EXPECTED = {
    "accounting": "README.md",
    "training": "README.md",
    "own-loop": "docs/guide/own-loop.md",
    "torchrun": "docs/guide/distributed.md",
    "keras-fit": "docs/guide/keras.md",
    "audit-own-loop": "docs/guide/audits.md",
}


def example_pages() -> list[Path]:
    """The pages whose marked examples are run: the README and every guide page."""
    return [README, *sorted(GUIDE.glob("*.md"))]


def find_examples() -> dict[str, tuple[Path, str, str]]:
    """Every marked example: name -> (page, language, code); a name given twice fails."""
    found: dict[str, tuple[Path, str, str]] = {}
    for page in example_pages():
        for name, language, code in EXAMPLE.findall(page.read_text(encoding="utf-8")):
            assert name not in found, f"example {name!r} in {found[name][0]} and in {page}"
            found[name] = (page, language, code)
    return found


EXAMPLES = find_examples()
PYTHON_EXAMPLES = sorted(
    name for name, (_, language, _) in EXAMPLES.items() if language == "python"
)


def test_the_examples_are_found_where_expected() -> None:
    where = {name: page.relative_to(ROOT).as_posix() for name, (page, _, _) in EXAMPLES.items()}
    assert where == EXPECTED
    assert sorted(set(EXAMPLES) - set(PYTHON_EXAMPLES)) == ["torchrun"]  # the others run here
    markers = sum(p.read_text(encoding="utf-8").count("<!-- example: ") for p in example_pages())
    assert markers == len(EXAMPLES)  # no marker without its block right under it


def test_the_training_page_shows_the_readmes_training_example_as_run() -> None:
    _, _, code = EXAMPLES["training"]
    assert f"```python\n{code}```" in (GUIDE / "training.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", PYTHON_EXAMPLES)
def test_example_runs_as_pasted(name: str, tmp_path: Path) -> None:
    page, _, code = EXAMPLES[name]
    here = Path.cwd()
    os.chdir(tmp_path)  # examples may write files (privacy.json, run.pt)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"{page.name} example {name}", "exec"), {"__name__": "example"})
    finally:
        os.chdir(here)
    if name == "audit-own-loop":
        _check_the_audit_examples_sentence(printed.getvalue(), page.read_text(encoding="utf-8"))


def _check_the_audit_examples_sentence(printed: str, page: str) -> None:
    """The sentence after the audit example states what it prints (rows, verdicts, bounds)."""
    rows = dict(re.findall(r"^\s*(\w+): (.*)$", printed, re.M))
    assert len(rows) == 9 and all(v.startswith("consistent") for v in rows.values()), printed
    after = page.split("<!-- example: audit-own-loop -->", 1)[1]
    sentence = after.split("```", 2)[2].lstrip("\n").split("\n\n", 1)[0]
    assert sentence.strip().startswith("It prints nine `consistent` rows"), sentence
    per_step = re.search(r"ε_lb (\d+\.\d\d)", rows["whitebox_per_step"])
    one_run = re.search(r"ε_lb (\d+\.\d\d)", rows["one_run"])
    assert per_step is not None and one_run is not None, printed
    assert f"per-step ε_lb {per_step.group(1)} against" in " ".join(sentence.split())
    assert f"one-run ε_lb {one_run.group(1)} against" in " ".join(sentence.split())


def test_torchrun_example_runs_as_pasted(tmp_path: Path) -> None:
    _, language, block = EXAMPLES["torchrun"]
    assert language == "bash"
    script = re.search(r"<<'EOF'\n(.*?)\nEOF\n", block, re.S)
    assert script is not None and "torchrun --standalone --nproc-per-node 2 ddp_example.py" in block
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


def test_readme_is_a_front_page_with_the_ci_test_command() -> None:
    readme = README.read_text(encoding="utf-8")
    assert len(readme.encode("utf-8")) <= README_LIMIT
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == "pip install nox && nox -s tests" and ci in readme
    assert "pip install nox && nox -s reproduce" in readme and "nox -s docs" in readme


def _anchors(page: Path) -> set[str]:
    """The heading anchors of a Markdown page, as GitHub and MkDocs spell the simple ones."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}


def test_readme_links_resolve_to_files_and_anchors() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text(encoding="utf-8"))
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert len(local) > 20
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), link
        assert not anchor or anchor in _anchors(target), link
    guide = {link.partition("#")[0] for link in local if link.startswith("docs/guide/")}
    assert guide == {f"docs/guide/{p.name}" for p in GUIDE.glob("*.md")}  # every guide page


def _between(text: str, name: str) -> str:
    start, end = f"<!-- {name}:start -->\n", f"\n<!-- {name}:end -->"
    assert text.count(start) == 1 and text.count(end) == 1, name
    return text[text.index(start) + len(start) : text.index(end)]


def test_readme_headlines_are_written_from_the_committed_results() -> None:
    from audits.implementations import findings
    from bench import audit_fanout
    from reproductions import scoreboard

    readme = README.read_text(encoding="utf-8")
    assert _between(readme, "audit-headline") == findings.headline()
    assert findings.FRONT_PAGE == README
    record = json.loads((ROOT / "bench" / "results" / "audit_fanout.json").read_text())
    assert _between(readme, "audit-fanout") == audit_fanout.markdown(record)
    assert "README.md" in audit_fanout.PAGES
    saved = json.loads((ROOT / "figures" / "scoreboard.json").read_text())
    assert _between(readme, "scoreboard-totals") == scoreboard.totals_sentence(saved["rows"])
    assert scoreboard.README == README
    for line in (findings.headline(), audit_fanout.markdown(record)):
        assert 0 < len(line) <= 3 * 200  # a headline: one to three lines of text
