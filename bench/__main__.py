"""``python -m bench [NAME ...] [--quick] [--device cpu|cuda]``: run the named benchmarks.

Default: all of them. ``--quick`` asks each benchmark for its short profile (``training``: fewer
timed steps, see :mod:`bench.training`; ``accounting``: one repeat instead of three;
``training_memory``: lots up to 2**12 only, a smoke test); ``--device`` applies to ``training``
only (``accounting`` has no GPU part; ``training_memory`` measures host RSS on CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _accounting(results_dir: Path, *, quick: bool, device: str) -> list[dict[str, Any]]:
    from bench import accounting  # imports the peer accountants: only when asked for

    return accounting.run(results_dir, repeats=1 if quick else accounting.REPEATS)


def _training(results_dir: Path, *, quick: bool, device: str) -> list[dict[str, Any]]:
    from bench import training  # imports torch: only when asked for

    try:
        training.check_device(device)
    except RuntimeError as error:
        raise SystemExit(f"python -m bench training: {error}") from None
    return training.run(results_dir, quick=quick, device=device)


def _training_memory(results_dir: Path, *, quick: bool, device: str) -> list[dict[str, Any]]:
    from bench import training_memory  # imports torch in its workers: only when asked for

    if device != "cpu":
        raise SystemExit("python -m bench training_memory: CPU only (it measures host RSS)")
    return training_memory.run(results_dir, quick=quick)


def _distributed(results_dir: Path, *, quick: bool, device: str) -> list[dict[str, Any]]:
    from bench import distributed  # spawns gloo process groups: only when asked for

    if device != "cpu":
        raise SystemExit("python -m bench distributed: CPU (gloo) only for now")
    return distributed.run(results_dir, quick=quick)


BENCHMARKS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "accounting": _accounting,
    "training": _training,
    "training_memory": _training_memory,
    "distributed": _distributed,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run, of {sorted(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="the short profile of each one")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="training: where to run"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; expected names in {sorted(BENCHMARKS)}")
    for name in args.names or list(BENCHMARKS):
        rows = BENCHMARKS[name](RESULTS, quick=args.quick, device=args.device)
        print(json.dumps(rows, indent=1))
        print(f"wrote {RESULTS / (name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
