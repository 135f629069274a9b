"""``python -m reproductions [--profile quick|full] [--only NAME ...] [--executor E]``: regenerate
figures/.

Each reproduction first computes and saves its results (JSON + CSV with config and commit),
then draws its figure from the saved file only.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from collections.abc import Callable

from dpcore.errors import InvalidParameterError
from dpcore.runs import EXECUTOR_FORMS, parse_executor
from reproductions import scoreboard
from reproductions.abadi2016 import cifar10 as abadi2016_cifar10
from reproductions.abadi2016 import fig2
from reproductions.abadi2016 import mnist as abadi2016_mnist
from reproductions.abadi2016 import pca_ceiling as abadi2016_pca_ceiling
from reproductions.abadi2016 import seed_spread as abadi2016_seed_spread
from reproductions.abadi2016 import sweeps as abadi2016_sweeps
from reproductions.bu2019_gdp import initialisation as bu2019_initialisation
from reproductions.bu2019_gdp import privacy as bu2019_privacy
from reproductions.bu2019_gdp import tradeoff_curves
from reproductions.bu2019_gdp import training as bu2019_training
from reproductions.bu2021_jl import accuracy as jl_accuracy
from reproductions.bu2021_jl import epsilon_vs_epochs as jl_epsilon
from reproductions.bu2021_jl import memory as jl_memory
from reproductions.bu2021_jl import memory_report as jl_memory_report
from reproductions.bu2021_jl import speed as jl_speed
from reproductions.bu2021_jl import speed_report as jl_speed_report
from reproductions.bu2021_jl import summary as jl_summary
from reproductions.erm import compute as erm_compute
from reproductions.erm import plot as erm_plot
from reproductions.harness import Output
from reproductions.samplers import table as sampler_table

#: name -> (compute, plot); compute takes the profile name.
REPRODUCTIONS: dict[str, tuple[Callable[[str], None], Callable[[], None]]] = {
    "abadi2016_fig2": (
        lambda profile, executor=None: fig2.compute(executor=executor),
        fig2.plot,
    ),
    "abadi2016_mnist": (abadi2016_mnist.compute, abadi2016_mnist.plot),
    "abadi2016_sweeps": (abadi2016_sweeps.compute, abadi2016_sweeps.plot),
    # after abadi2016_sweeps: reads its seed-0 runs from the sweep's saved results
    "abadi2016_seed_spread": (abadi2016_seed_spread.compute, abadi2016_seed_spread.plot),
    "abadi2016_pca_ceiling": (abadi2016_pca_ceiling.compute, abadi2016_pca_ceiling.plot),
    "abadi2016_cifar10": (abadi2016_cifar10.compute, abadi2016_cifar10.plot),
    "bu2019_tradeoff_curves": (
        lambda profile, executor=None: tradeoff_curves.compute(executor=executor),
        tradeoff_curves.plot,
    ),
    "bu2019_privacy": (bu2019_privacy.compute, bu2019_privacy.plot),
    "bu2019_training": (bu2019_training.compute, bu2019_training.plot),
    "bu2019_initialisation": (bu2019_initialisation.compute, bu2019_initialisation.plot),
    "bu2021_jl_epsilon": (jl_epsilon.compute, jl_epsilon.plot),
    "bu2021_jl_speed": (jl_speed.compute, jl_speed_report.plot),
    "bu2021_jl_memory": (jl_memory.compute, jl_memory_report.plot),
    "bu2021_jl_accuracy": (jl_accuracy.compute, jl_accuracy.plot),
    # after bu2021_jl_speed: its figure reads the speed results
    "bu2021_jl_summary": (jl_summary.compute, jl_summary.plot),
    "erm": (erm_compute, erm_plot),
    "samplers": (sampler_table.compute, sampler_table.plot),
    # last: reads every saved result above (the full profiles' committed ones included)
    "scoreboard": (scoreboard.compute, scoreboard.plot),
}


def fanning_out() -> list[str]:
    """The reproductions that fan their runs out (their compute takes an ``executor``).

    Example:
        >>> {"bu2019_training", "bu2021_jl_summary"} <= set(fanning_out())
        True
    """
    return [
        name
        for name, (compute, _) in REPRODUCTIONS.items()
        if "executor" in inspect.signature(compute).parameters
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reproductions", description=__doc__)
    parser.add_argument(
        "--profile",
        choices=("quick", "full"),
        default="quick",
        help="quick (default, minutes on 2 CPU cores) or full (the papers' sizes)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=sorted(REPRODUCTIONS),
        default=None,
        help="run only these reproductions",
    )
    parser.add_argument(
        "--stop-after-hours",
        type=float,
        default=None,
        metavar="H",
        help="training reproductions stop their runs after H hours (resumable; results saved "
        "with the epochs reached)",
    )
    parser.add_argument(
        "--executor",
        default=None,
        metavar="E",
        help=f"where the runs of the reproductions that take it ({', '.join(fanning_out())}) "
        f"run: {EXECUTOR_FORMS} (default: local, in this process); e.g. processes:20 for 20 runs "
        "sharing one GPU. The timings of bu2021_jl_speed and bu2021_jl_memory are handed over "
        "one at a time. See docs/cluster.md",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="the same as --executor processes:N",
    )
    parser.add_argument(
        "--runs-code",
        default=None,
        metavar="FINGERPRINT",
        help="report (and continue) the stored runs trained by the code with this fingerprint "
        "(a run folder's suffix) instead of the current code's; for runs begun by an earlier "
        "commit whose training code gives the same results. The results record both "
        "fingerprints",
    )
    args = parser.parse_args(argv)
    if args.workers is not None:
        if args.executor is not None:
            parser.error("--workers N is --executor processes:N: give one of them")
        if args.workers < 1:
            parser.error(f"--workers must be >= 1, got {args.workers}")
        args.executor = f"processes:{args.workers}"
    if args.executor is not None:
        try:
            parse_executor(args.executor)
        except InvalidParameterError as error:
            parser.error(f"--executor: {error}")
    if args.stop_after_hours is not None and not args.stop_after_hours > 0:
        parser.error(f"--stop-after-hours must be > 0, got {args.stop_after_hours}")
    deadline = None if args.stop_after_hours is None else time.time() + 3600 * args.stop_after_hours
    for name in args.only or list(REPRODUCTIONS):
        compute, plot = REPRODUCTIONS[name]
        start = time.perf_counter()
        accepted = inspect.signature(compute).parameters
        options: dict[str, object] = {}
        if deadline is not None and "deadline" in accepted:
            options["deadline"] = deadline
        if args.executor is not None:
            if "executor" in accepted:
                options["executor"] = args.executor
            else:
                print(
                    f"{name}: --executor not used (it does not fan out yet: runs in this process)"
                )
        if args.runs_code is not None:
            if "output" not in accepted:
                parser.error(f"--runs-code: {name} keeps no run store")
            options["output"] = Output(runs_code=args.runs_code)
        compute(args.profile, **options)
        plot()
        print(f"{name}: done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
