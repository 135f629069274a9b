"""``python -m audits [--only NAME ...] [--executor E] [--profile quick|full]``: run the audits,
save results, write the report.

``--executor`` (:func:`dpcore.runs.run_many`'s choices: ``local``, ``processes:N``,
``dask[:ADDRESS]``, ``ray[:ADDRESS]``, ``slurm``) fans each audit's runs out; the result files
are the same as in this process (every run has its own seed). Finished runs are kept in the
audits' run stores (``audits/results/runs/``), so an interrupted audit resumes.

``--profile`` (``quick``, the default, or ``full``) sizes the audits that have profiles (the
multi-run black-box membership audit); the others ignore it. A full profile keeps its finished
runs in a committed run bundle (``audits/results/checkpoints/``) after every row, so a profile
longer than one machine's session resumes from a fresh checkout (the multi-run and the
crafted-gradient black-box audits).

``--settings TEXT ...`` audits only the settings whose names contain one of the texts (the
black-box audits: multi-run, crafted-gradient, one-run); the saved rows of the other settings
stay.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from collections.abc import Callable
from typing import Any

from audits import (
    blackbox,
    clt_check,
    dpsgd_jl,
    dpsgd_positions,
    dpsgd_whitebox,
    mechanisms,
    membership,
    one_run,
    planted_bugs,
    report,
    sampler_audit,
)
from audits.blackbox import crafted_audit as blackbox_crafted
from audits.blackbox import one_run as blackbox_one_run
from audits.blackbox import one_run_report as blackbox_one_run_report
from audits.implementations import table as implementations
from dpcore.errors import InvalidParameterError
from dpcore.runs import parse_executor

#: name -> (run, write the report from the saved results)
AUDITS: dict[str, tuple[Callable[..., Any], Callable[[], None]]] = {
    "mechanisms": (mechanisms.run, lambda: report.write("mechanisms")),
    "clt_check": (clt_check.run, clt_check.write_report),
    "dpsgd_whitebox": (dpsgd_whitebox.run, dpsgd_whitebox.write_report),
    "planted_bugs": (planted_bugs.run, planted_bugs.write_report),
    "dpsgd_jl": (dpsgd_jl.run, dpsgd_jl.write_report),
    "dpsgd_positions": (dpsgd_positions.run, dpsgd_positions.write_report),
    "sampler_audit": (sampler_audit.run, sampler_audit.write_report),
    "one_run": (one_run.run, one_run.write_report),
    "membership": (membership.run, membership.write_report),
    "blackbox": (blackbox.run, blackbox.write_report),
    "blackbox_one_run": (blackbox_one_run.run, blackbox_one_run_report.write_report),
    "blackbox_crafted": (blackbox_crafted.run, blackbox_crafted.write_report),
    "implementations": (implementations.run, implementations.write_report),
}


#: the run bundles the full profiles resume from (committed, see :mod:`dpcore.runs.bundle`)
CHECKPOINTS = {"blackbox": blackbox.CHECKPOINT, "blackbox_crafted": blackbox_crafted.CHECKPOINT}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m audits", description=__doc__)
    parser.add_argument("--only", nargs="+", choices=sorted(AUDITS), default=None)
    parser.add_argument(
        "--executor",
        default=None,
        help="where runs go: local, processes:N, dask[:ADDRESS], ray[:ADDRESS], slurm",
    )
    parser.add_argument(
        "--profile",
        choices=("quick", "full"),
        default="quick",
        help="size of the audits that have profiles (quick: minutes on 2 cores)",
    )
    parser.add_argument(
        "--settings",
        nargs="+",
        default=None,
        metavar="TEXT",
        help="audit only the settings whose names contain one of these texts (audits with "
        "several settings; the saved rows of the others stay)",
    )
    args = parser.parse_args(argv)
    if args.executor is not None:
        try:
            parse_executor(args.executor)
        except InvalidParameterError as error:
            parser.error(f"--executor: {error}")
    for name in args.only or list(AUDITS):
        start = time.perf_counter()
        run, write_report = AUDITS[name]
        options: dict[str, Any] = {}
        accepted = inspect.signature(run).parameters
        if "profile" in accepted:
            options["profile"] = args.profile
        if args.profile == "full" and "checkpoint" in accepted:
            options["checkpoint"] = CHECKPOINTS[name]
        if args.settings is not None:
            if "setting_names" not in accepted:
                parser.error(f"--settings: the {name!r} audit has no settings to choose from")
            options["setting_names"] = args.settings
        if args.executor is not None:
            if "executor" in accepted:
                options["executor"] = args.executor
            else:
                print(f"{name}: --executor not used (it runs in this process)")
        run(**options)
        write_report()
        print(f"{name}: done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
