"""dpcore's runtime needs numpy and scipy only; peers and test tools must never be imported."""

from __future__ import annotations

import subprocess
import sys

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
