"""``python -m bench [NAME ...] [--quick] [--device cpu|cuda] [--executor E]``: run benchmarks.

Default: all of them whose framework is installed (``tf_training`` needs the ``tf`` extra; it
is skipped, with a note, where TensorFlow is absent). ``--quick`` asks each benchmark for its
short profile (``training`` and ``tf_training``: fewer timed steps, see :mod:`bench.training`
and :mod:`bench.tf_training`; ``accounting``: one repeat instead of three; ``training_memory``:
lots up to 2**12 only, a smoke test); ``--device`` applies to ``training`` only (``accounting``
has no GPU part; ``training_memory`` measures host RSS on CPU; ``tf_training`` runs on CPU).
``--executor`` (:func:`dpcore.runs.run_many`: ``local``, ``processes:N``, ``dask[:ADDRESS]``,
``ray[:ADDRESS]``, ``slurm``) sends the cells of every benchmark to that executor. Timing cells
(``accounting``, ``training``, ``distributed``, ``tf_training``) are handed over one at a time
(:func:`dpcore.runs.one_at_a_time`): two timings on one machine would contend for its cores, so
the executor only chooses where each cell is timed, alone, and every row names that machine
(``hardware``). ``training_memory`` runs its methods' sweeps at once (each lot in its own
worker under its own memory cap). ``audit_fanout`` (:mod:`bench.audit_fanout`) times one
per-step audit in process, on one spawned process and on several: the executors are what it
measures, so ``--executor`` does not apply to it. ``models`` (:mod:`bench.models`, needs
transformers and peft: the ``bench`` dependency group) times library models (transformers,
peft, ``nn.TransformerEncoder``) against Opacus and checks their per-example gradients; its
``--quick`` profile measures two models, three repetitions.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpcore.errors import InvalidParameterError
from dpcore.runs import EXECUTOR_FORMS, parse_executor

RESULTS = Path(__file__).resolve().parent / "results"


def _accounting(
    results_dir: Path, *, quick: bool, device: str, executor: str | None = None
) -> list[dict[str, Any]]:
    from bench import accounting  # imports the peer accountants: only when asked for

    repeats = 1 if quick else accounting.REPEATS
    return accounting.run(results_dir, repeats=repeats, executor=executor)


def _training(
    results_dir: Path, *, quick: bool, device: str, executor: str | None = None
) -> list[dict[str, Any]]:
    from bench import training  # imports torch: only when asked for

    try:
        training.check_device(device)
    except RuntimeError as error:
        raise SystemExit(f"python -m bench training: {error}") from None
    return training.run(results_dir, quick=quick, device=device, executor=executor)


def _training_memory(
    results_dir: Path, *, quick: bool, device: str, executor: str | None = None
) -> list[dict[str, Any]]:
    from bench import training_memory  # imports torch in its workers: only when asked for

    if device != "cpu":
        raise SystemExit("python -m bench training_memory: CPU only (it measures host RSS)")
    return training_memory.run(results_dir, quick=quick, executor=executor)


def _distributed(
    results_dir: Path, *, quick: bool, device: str, executor: str | None = None
) -> list[dict[str, Any]]:
    from bench import distributed  # spawns gloo process groups: only when asked for

    if device != "cpu":
        raise SystemExit("python -m bench distributed: CPU (gloo) only for now")
    return distributed.run(results_dir, quick=quick, executor=executor)


def _tf_training(
    results_dir: Path, *, quick: bool, device: str, executor: str | None = None
) -> list[dict[str, Any]]:
    from bench import tf_training  # imports TensorFlow in its workers: only when asked for

    if device != "cpu":
        raise SystemExit("python -m bench tf_training: CPU only (the tf extra is tensorflow-cpu)")
    try:
        tf_training.check_tensorflow()
    except RuntimeError as error:
        raise SystemExit(f"python -m bench tf_training: {error}") from None
    return tf_training.run(results_dir, quick=quick, executor=executor)


def _models(
    results_dir: Path,
    *,
    quick: bool,
    device: str,
    executor: str | None = None,
    models: list[str] | None = None,
) -> list[dict[str, Any]]:
    from bench import models as benchmark  # imports torch, transformers and Opacus: when asked

    if device != "cpu":
        raise SystemExit("python -m bench models: CPU only for now")
    # the full profile measures each model in a fresh interpreter (bench.models.run)
    return benchmark.run(
        results_dir,
        quick=quick,
        executor=executor,
        fresh_process=not quick,
        models=tuple(models) if models else None,
        add=bool(models),
    )


def _audit_fanout(results_dir: Path, *, quick: bool, device: str) -> list[dict[str, Any]]:
    from bench import audit_fanout  # imports torch: only when asked for

    if device != "cpu":
        raise SystemExit("python -m bench audit_fanout: CPU only (it compares CPU processes)")
    return audit_fanout.run(results_dir, quick=quick)


BENCHMARKS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "accounting": _accounting,
    "training": _training,
    "training_memory": _training_memory,
    "audit_fanout": _audit_fanout,
    "distributed": _distributed,
    "tf_training": _tf_training,
    "models": _models,
}
#: Benchmarks run by default only where their framework (a module) is installed.
OPTIONAL = {"tf_training": "tensorflow", "models": "transformers"}


def default_names() -> list[str]:
    """Every benchmark but the optional ones whose framework is not installed."""
    return [
        name
        for name in BENCHMARKS
        if name not in OPTIONAL or importlib.util.find_spec(OPTIONAL[name]) is not None
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run, of {sorted(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="the short profile of each one")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="training: where to run"
    )
    parser.add_argument(
        "--executor",
        default=None,
        metavar="E",
        help=f"where the cells of the benchmarks run: {EXECUTOR_FORMS} (default: local, one "
        "after another); timing cells are handed over one at a time, each row naming the "
        "machine that timed it; see docs/cluster.md",
    )
    parser.add_argument(
        "--add-models",
        nargs="+",
        default=None,
        metavar="NAME",
        help="models: measure only these rows and add them to the saved models.json (rows of "
        "the same models and sizes replaced, the others kept); NAME:wide for a model at the "
        "realistic width",
    )
    args = parser.parse_args(argv)
    if args.add_models is not None and args.names != ["models"]:
        parser.error("--add-models: only with the models benchmark alone (python -m bench models)")
    if args.executor is not None:
        try:
            parse_executor(args.executor)
        except InvalidParameterError as error:
            parser.error(f"--executor: {error}")
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; expected names in {sorted(BENCHMARKS)}")
    names = args.names or default_names()
    for name in [] if args.names else sorted(set(BENCHMARKS) - set(names)):
        print(f"skipped {name}: {OPTIONAL[name]} is not installed")
    for name in names:
        run = BENCHMARKS[name]
        options: dict[str, Any] = {}
        if args.executor is not None:
            if "executor" in inspect.signature(run).parameters:
                options["executor"] = args.executor
            else:
                print(f"{name}: --executor not used (it measures one cell at a time here)")
        if args.add_models is not None:
            options["models"] = args.add_models
        rows = run(RESULTS, quick=args.quick, device=args.device, **options)
        print(json.dumps(rows, indent=1))
        print(f"wrote {RESULTS / (name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
