"""dpcore.runs imports the standard library only: no numpy, no engine until one is asked for."""

from __future__ import annotations

import subprocess
import sys

BLOCKED = (
    "numpy",
    "scipy",
    "torch",
    "tensorflow",
    "tqdm",
    "dask",
    "distributed",
    "ray",
    "submitit",
)

PROGRAM = f"""
import importlib, importlib.abc, pkgutil, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(name + " is blocked")
        return None
sys.meta_path.insert(0, Block())
import dpcore.runs as runs
for module in pkgutil.walk_packages(runs.__path__, "dpcore.runs."):
    importlib.import_module(module.name)
from dpcore.runs import RunStore, run_many
from dpcore.runs.example import ExampleSpec, example_run
store = RunStore(sys.argv[1], code="x")
print(run_many(example_run, [ExampleSpec(1, steps=10)], store=store, progress=True)[0]["steps"])
"""


def test_the_run_layer_needs_the_standard_library_only(tmp_path: object) -> None:
    completed = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip() == "10"  # and the progress bar is skipped without tqdm
