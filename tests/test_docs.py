"""The documentation site builds with ``mkdocs build --strict`` and holds what it promises.

The site is built once (into a temporary folder, the tutorials' code executed); the checks read
the built HTML: the home page, every public name of every API page (the ``__all__`` of each
module a page documents, read from the sources), the tutorials' executed output, the guide
pages and the results pages against the committed files they include or the sections written
into them, and every internal
link and anchor. The docs group must be installed (``nox -s tests`` installs it): without it
these tests fail, they do not skip.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REFERENCE_PAGES = (
    "accountants",
    "events",
    "tradeoff",
    "calibration",
    "torch",
    "tf",
    "erm",
    "auditing",
    "runs",
    "data",
)
DOCS_MODULES = (
    "mkdocs",
    "material",
    "mkdocstrings",
    "mkdocstrings_handlers.python",
    "griffe",
    "markdown_exec",
)
TUTORIALS = DOCS / "tutorials"
#: The opening line of a block that markdown-exec runs at build time.
EXECUTED = re.compile(r'^```python exec="on"', re.MULTILINE)
DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.MULTILINE)


def _require_docs_group() -> None:
    missing = [name for name in DOCS_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        pytest.fail(
            f"The docs group is not installed (missing: {', '.join(missing)}): install it with "
            "`pip install --group docs` (pip >= 25.1) or run `nox -s tests`, which installs it."
        )


def _load(name: str) -> ModuleType:
    """A script of docs/ (not a package) loaded as a module."""
    _require_docs_group()
    spec = importlib.util.spec_from_file_location(f"docs_{name}", DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_site(out: Path) -> Path:
    """``mkdocs build --strict`` into ``out`` (the build must succeed); return ``out``."""
    _require_docs_group()
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def site(docs_site: Path) -> Path:
    return docs_site  # built once per test session (conftest.py)


def page(site: Path, path: str) -> str:
    """The HTML of the built page for ``docs/<path>.md`` (``index`` for the home page)."""
    built = site / ("index.html" if path == "index" else f"{path}/index.html")
    assert built.is_file(), f"{built} was not built"
    return built.read_text()


def text(html: str) -> str:
    """The page's text, tags removed and entities decoded, whitespace collapsed."""

    class Collector(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.parts: list[str] = []

        def handle_data(self, data: str) -> None:
            self.parts.append(data)

    collector = Collector()
    collector.feed(html)
    return " ".join(" ".join(collector.parts).split())


def module_source(module: str) -> Path:
    base = ROOT.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def public_names(module: str) -> list[str]:
    """A module's ``__all__``, or (without one) its top-level classes and functions not ``_``."""
    tree = ast.parse(module_source(module).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                assert node.value is not None
                return [str(name) for name in ast.literal_eval(node.value)]
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and not node.name.startswith("_")
    ]


def documented_on(html: str, module: str, name: str) -> bool:
    """Whether the page has ``module.name``'s heading.

    A name exported from a submodule of the same name (``dpcore.erm.output_perturbation``) is
    read by griffe as the submodule, so the page documents it by its full path instead.
    """
    if f'id="{module}.{name}"' in html:
        return True
    return module_source(f"{module}.{name}").is_file() and f'id="{module}.{name}.{name}"' in html


def test_home_page_says_what_dpcore_is_and_gives_the_two_commands(site: Path) -> None:
    home = text(page(site, "index"))
    assert "differentially private" in home.lower()
    assert "pip install nox && nox -s reproduce" in home
    assert "pip install nox && nox -s tests" in home


def test_every_reference_page_is_in_the_docs() -> None:
    found = {path.stem for path in (DOCS / "reference").glob("*.md")}
    assert found == set(REFERENCE_PAGES)


@pytest.mark.parametrize("name", REFERENCE_PAGES)
def test_reference_page_documents_every_public_name(site: Path, name: str) -> None:
    html = page(site, f"reference/{name}")
    modules = DIRECTIVE.findall((DOCS / "reference" / f"{name}.md").read_text())
    assert modules and all(module.startswith("dpcore.") for module in modules)
    documented = 0
    for module in modules:
        assert f'id="{module}"' in html, module
        if not module_source(module).is_file():
            continue  # an object, not a module: its heading is all there is to check
        names = public_names(module) if module != "dpcore.torch" else []
        missing = [n for n in names if not documented_on(html, module, n)]
        assert not missing, f"{module}: {missing}"
        documented += len(names)
    assert documented > 0


def test_scoreboard_page_shows_the_committed_scoreboard(site: Path) -> None:
    shown = text(page(site, "results/scoreboard"))
    committed = (ROOT / "reproductions" / "SCOREBOARD.md").read_text()
    totals = re.search(r"\*\*(\d+ numbers: [^*]+)\*\*", committed)
    assert totals is not None
    assert totals.group(1) in shown
    rows = [line for line in committed.splitlines() if line.startswith("| ") and "---" not in line]
    first = [cell.strip() for cell in rows[1].strip("|").split("|")]  # rows[0] is the header
    paper, ours = first[2], first[3]
    assert re.fullmatch(r"[\d.]+", ours), ours
    assert f"{paper} {ours}" in shown


def test_audit_page_shows_the_committed_tables(site: Path) -> None:
    shown = text(page(site, "results/audits"))
    committed = (ROOT / "audits" / "results" / "implementations.md").read_text()
    rows = [line for line in committed.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) > 2
    for row in (rows[1], rows[-1]):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert " ".join(cells) in shown, cells


def test_benchmark_page_shows_each_committed_result(site: Path) -> None:
    tables = _load("bench_tables")
    shown = text(page(site, "results/benchmarks"))
    names = tables.committed_results()
    assert "nox -s bench" in shown
    for name in names:
        data = json.loads((ROOT / "bench" / "results" / f"{name}.json").read_text())
        rows = data["rows"] if isinstance(data, dict) else data
        assert f"bench/results/{name}.json" in shown
        step = rows[0].get("step_seconds", rows[0].get("step_s"))
        assert tables.cell(step) in shown, name
        meta = ROOT / "bench" / "results" / f"{name}.meta.json"
        if meta.exists():
            assert json.loads(meta.read_text())["commit"] in shown


class Links(HTMLParser):
    """The ids of a page and the targets of its ``href``/``src`` attributes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.targets: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if key in ("id", "name") and value:
                self.ids.add(value)
            if key in ("href", "src") and value is not None:
                self.targets.append(value)


def test_no_internal_link_points_to_a_missing_file_or_anchor(site: Path) -> None:
    site = site.resolve()
    pages = {path.resolve(): Links() for path in site.rglob("*.html")}
    for path, links in pages.items():
        links.feed(path.read_text())
    broken: list[str] = []
    checked = 0
    for path, links in pages.items():
        for target in links.targets:
            parts = urlsplit(target)
            if parts.scheme or parts.netloc:
                continue  # external
            if parts.path:
                base = site if parts.path.startswith("/") else path.parent
                resolved = (base / unquote(parts.path).lstrip("/")).resolve()
                if resolved.is_dir() or parts.path.endswith("/"):
                    resolved = resolved / "index.html"
            else:
                resolved = path
            checked += 1
            if not resolved.is_file() or not resolved.is_relative_to(site):
                broken.append(f"{path.relative_to(site)}: {target}")
            elif parts.fragment and unquote(parts.fragment) not in pages.get(resolved, Links()).ids:
                broken.append(f"{path.relative_to(site)}: {target} (no such anchor)")
    assert checked > 100
    assert not broken, broken[:20]


def test_bench_table_drops_empty_columns_and_escapes_cells() -> None:
    tables = _load("bench_tables")
    rendered = tables.table([{"a": 1.234567, "b": None, "c": "x|y"}, {"a": None, "b": None}])
    lines = rendered.splitlines()
    assert lines[0] == "| a | c |"
    assert lines[2] == "| 1.235 | x\\|y |"
    assert lines[3] == "| — | — |"
    with pytest.raises(ValueError, match="non-empty list"):
        tables.table([])


def test_griffe_extension_renames_examples_links_roles_and_adds_unpacked_names() -> None:
    extension = _load("griffe_docstrings")
    assert extension.examples_titled("Doc.\n\n    Example:\n        >>> 1\n") == (
        "Doc.\n\n    Examples:\n        >>> 1\n"
    )
    assert extension.examples_titled("An Example: here\n") == "An Example: here\n"
    import griffe

    module = griffe.load("dpcore.accountants", search_paths=[str(ROOT)])
    pld = module["PldAccountant"]
    linked = extension.roles_linked(pld, "See :class:`~dpcore.events.GaussianEvent` and :mod:`x`.")
    assert '<autoref identifier="dpcore.events.GaussianEvent" optional>' in linked
    assert "<code>GaussianEvent</code>" in linked
    assert 'identifier="dpcore.accountants.pld.x"' in linked
    text_module = griffe.load("dpcore.data.text", search_paths=[str(ROOT)])
    assert "PAD" not in text_module.members  # bound by `PAD, OOV = 0, 1`: griffe skips it
    assert extension.add_unpacked_exports(text_module) == ["PAD", "OOV"]
    assert text_module["PAD"].value == "0"
    assert extension.add_unpacked_exports(text_module) == []


def _nav_paths() -> list[str]:
    """Every page path in mkdocs.yml's nav."""
    import yaml

    def walk(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [path for item in node for path in walk(item)]
        if isinstance(node, dict):
            return [path for value in node.values() for path in walk(value)]
        return []

    return walk(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])


def test_every_tutorial_is_in_the_nav_and_every_block_ran(site: Path) -> None:
    tutorials = sorted(TUTORIALS.glob("*.md"))
    assert tutorials
    nav = _nav_paths()
    for source in tutorials:
        assert f"tutorials/{source.name}" in nav, source.name
        blocks = len(EXECUTED.findall(source.read_text()))
        assert blocks > 0, f"{source.name} runs no code"
        html = page(site, f"tutorials/{source.stem}")
        # markdown-exec puts each block's output in a div of class "result"
        assert html.count('class="result"') == blocks, source.name
        assert "Traceback" not in text(html), source.name


def test_accounting_tutorial_shows_this_builds_numbers(site: Path) -> None:
    from dpcore.accountants import ACCOUNTANT_NAMES, PldAccountant
    from dpcore.events import dpsgd_event

    shown = text(page(site, "tutorials/accounting"))
    event = dpsgd_event(sampling_probability=0.01, noise_multiplier=4.0, steps=10_000)
    interval = PldAccountant().compose(event).get_epsilon_interval(1e-5)
    assert f"pld: epsilon in [{interval.lower:.4f}, {interval.upper:.4f}]" in shown
    for name in ACCOUNTANT_NAMES:
        assert f"{name}: epsilon" in shown, name


def test_keras_tutorial_trains_and_refuses_keras_batching(site: Path) -> None:
    from dpcore.accountants import RdpAccountant
    from dpcore.events import dpsgd_event

    shown = text(page(site, "tutorials/keras"))
    # 3 epochs of q = 0.05: 60 lots, and the epsilon printed is the accountant's for them
    epsilon = (
        RdpAccountant()
        .compose(dpsgd_event(sampling_probability=0.05, noise_multiplier=1.0, steps=60))
        .get_epsilon(1e-5)
    )
    assert f"60 lots in the ledger; epsilon {epsilon:.2f} at delta 1e-5" in shown
    assert "matches the Poisson analysis: True" in shown
    assert "InvalidParameterError" in shown and "ledger after the refusal: 60 lots" in shown


def _section(source: Path, name: str) -> str:
    """The text of ``source`` between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``."""
    written = source.read_text()
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    return written[written.index(start) + len(start) : written.index(end)]


def _squeezed(words: str) -> str:
    """Text without code and emphasis marks or whitespace (``text`` spaces out inline tags)."""
    return re.sub(r"[`*\s]", "", words)


def test_limits_page_shows_its_text_and_the_limits_table(site: Path) -> None:
    assert "limits.md" in _nav_paths()
    shown = _squeezed(text(page(site, "limits")))
    section = (DOCS / "limits.md").read_text().split("\n\n", 2)[2]  # after the title and intro
    paragraphs = [p for p in section.strip().split("\n\n") if not p.lstrip().startswith("|")]
    assert len(paragraphs) > 2
    last_item = section.strip().split("\n- ")[-1]  # the section ends with a list
    for paragraph in (paragraphs[0], last_item):
        assert _squeezed(paragraph) in shown, paragraph[:80]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    first = rows[1].strip("|").split("|")  # rows[0] is the header
    assert _squeezed("".join(first)) in shown


def test_guide_pages_are_in_the_nav() -> None:
    nav = _nav_paths()
    pages = sorted(path.name for path in (DOCS / "guide").glob("*.md"))
    assert len(pages) > 10
    assert [name for name in pages if f"guide/{name}" not in nav] == []


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("guide/samplers", "sampler-table"),
        ("guide/audits", "implementation-audits"),
        ("guide/audits", "planted-bug-audits"),
    ],
)
def test_guide_page_shows_the_table_written_into_it(site: Path, source: str, name: str) -> None:
    shown = text(page(site, source))
    rows = [
        line
        for line in _section(DOCS / f"{source}.md", name).splitlines()
        if line.startswith("| ") and "---" not in line
    ]
    assert len(rows) > 2
    for row in (rows[1], rows[-1]):
        assert " ".join(cell.strip() for cell in row.strip("|").split("|")) in shown, row


def test_figures_page_shows_committed_figures_as_committed(site: Path) -> None:
    committed = set(_load("figure_files").committed_figures())
    built = site / "results" / "figures" / "index.html"
    images = re.findall(r'<img [^>]*src="([^"]+)"', page(site, "results/figures"))
    assert images
    for target in images:
        shown = (built.parent / target).resolve()
        relative = shown.relative_to(site.resolve()).as_posix()
        assert relative in committed, relative
        assert shown.read_bytes() == (ROOT / relative).read_bytes(), relative


def test_a_failing_tutorial_block_fails_the_build(tmp_path: Path) -> None:
    _require_docs_group()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(
        '# Broken\n\n```python exec="on"\nraise ValueError("this block fails")\n```\n'
    )
    (tmp_path / "mkdocs.yml").write_text(
        "site_name: broken\nplugins:\n  - markdown-exec\nmarkdown_extensions:\n"
        "  - pymdownx.superfences\n"
    )
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "out")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=120,
    )
    assert completed.returncode != 0
    assert "exited with errors" in completed.stderr, completed.stderr[-2000:]
