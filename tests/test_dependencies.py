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
