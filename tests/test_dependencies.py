"""dpcore's runtime needs numpy and scipy only; peers and test tools must never be imported.

And the support folders (bench/, reproductions/, audits/) import dpcore and themselves only,
never one another: what they share lives in dpcore (run plumbing in :mod:`dpcore.runs`).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

FORBIDDEN = (
    "mpmath",
    "dp_accounting",
    "opacus",
    "prv_accountant",
    "hypothesis",
    "matplotlib",
    "tqdm",
    "tensorflow_privacy",
)

PROGRAM = f"""
import importlib, pkgutil, sys
for name in {FORBIDDEN!r}:
    sys.modules[name] = None  # any import of it now raises ImportError
import dpcore
for module in pkgutil.walk_packages(dpcore.__path__, "dpcore."):
    if module.name != "dpcore.__main__":
        importlib.import_module(module.name)
print("ok")
"""


def test_every_dpcore_module_imports_without_optional_packages() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "ok"


def test_each_framework_backend_imports_without_the_other() -> None:
    """dpcore.tf never needs torch and dpcore.torch never needs TensorFlow.

    The other framework is made unimportable by a finder that raises ImportError (not by a None
    in ``sys.modules``, which third-party probes such as SciPy's array-API check trip over).
    """
    for blocked, package in (("torch", "dpcore.tf"), ("tensorflow", "dpcore.torch")):
        program = f"""
import importlib, importlib.abc, pkgutil, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {blocked!r} or name.startswith({blocked + "."!r}):
            raise ImportError(name + " is blocked")
        return None
sys.meta_path.insert(0, Block())
import {package} as package
for module in pkgutil.walk_packages(package.__path__, {package + "."!r}):
    importlib.import_module(module.name)
assert {blocked!r} not in sys.modules
print("ok")
"""
        completed = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, check=False
        )
        assert completed.returncode == 0, (package, completed.stderr[-2000:])
        assert completed.stdout.strip().endswith("ok")


#: The support folders: each may import dpcore and itself, never another of them.
SUPPORT = ("bench", "reproductions", "audits")
#: A string that names a module of a support folder (``importlib``, ``python -m`` commands,
#: code fingerprints): ``bench``, ``reproductions.bu2021_jl.speed``...
_MODULE_NAME = re.compile(r"(bench|reproductions|audits)(\.[A-Za-z_]\w*)*")
_DASH_M = re.compile(r"-m\s+((bench|reproductions|audits)(\.[A-Za-z_]\w*)*)")

#: Imports between support folders not yet removed, each named: (importing file, module). The
#: test fails on any other, and on any of these once it is gone (so the list only shrinks).
KNOWN: set[tuple[str, str]] = set()


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes of a module and of its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def modules_named(source: str) -> set[str]:
    """Every support-folder module ``source`` imports or names: ``import``/``from`` statements
    at any depth (inside functions too), and strings naming a module (``importlib``,
    ``python -m`` commands, code fingerprints), docstrings aside.

    Example:
        >>> sorted(modules_named("def f():\\n    from bench.cells import Cell\\n"
        ...     "run(['python', '-m', 'audits.report'])\\nimport_module('reproductions')"))
        ['audits.report', 'bench.cells', 'reproductions']
    """
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in docstrings:
                continue
            if _MODULE_NAME.fullmatch(node.value):
                names.add(node.value)
            names.update(match.group(1) for match in _DASH_M.finditer(node.value))
    return {name for name in names if name.split(".")[0] in SUPPORT}


def test_support_folders_import_only_dpcore_and_themselves() -> None:
    """bench/, reproductions/ and audits/ never import one another (KNOWN aside, by name)."""
    root = Path(__file__).resolve().parents[1]
    crossing = set()
    for package in SUPPORT:
        for path in sorted((root / package).rglob("*.py")):
            for name in modules_named(path.read_text(encoding="utf-8")):
                if name.split(".")[0] != package:
                    crossing.add((path.relative_to(root).as_posix(), name))
    assert crossing - KNOWN == set(), "imports between support folders"
    assert KNOWN - crossing == set(), "gone: remove them from KNOWN"


def test_the_import_scan_sees_every_form() -> None:
    source = (
        "import bench\n"
        "from audits import report\n"
        "def late():\n"
        "    import reproductions.common as common\n"
        "    importlib.import_module('bench.cells')\n"
        "    subprocess.run([sys.executable, '-m', 'audits.implementations.tf_privacy_worker'])\n"
        "    os.system('python -m reproductions --only erm')\n"
        "def documented():\n"
        "    '''Run python -m bench first; see reproductions.common.'''\n"
        "text = 'benchmarks of reproductions'\n"
    )
    assert modules_named(source) == {
        "bench",
        "audits",
        "reproductions.common",
        "bench.cells",
        "audits.implementations.tf_privacy_worker",
        "reproductions",
    }
