"""``python -m audits [--only NAME ...]``: run the audits, save results, write the report."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from audits import (
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
from audits.implementations import table as implementations

#: name -> (run, write the report from the saved results)
AUDITS: dict[str, tuple[Callable[[], Any], Callable[[], None]]] = {
    "mechanisms": (mechanisms.run, lambda: report.write("mechanisms")),
    "clt_check": (clt_check.run, clt_check.write_report),
    "dpsgd_whitebox": (dpsgd_whitebox.run, dpsgd_whitebox.write_report),
    "planted_bugs": (planted_bugs.run, planted_bugs.write_report),
    "dpsgd_jl": (dpsgd_jl.run, dpsgd_jl.write_report),
    "dpsgd_positions": (dpsgd_positions.run, dpsgd_positions.write_report),
    "sampler_audit": (sampler_audit.run, sampler_audit.write_report),
    "one_run": (one_run.run, one_run.write_report),
    "membership": (membership.run, membership.write_report),
    "implementations": (implementations.run, implementations.write_report),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m audits", description=__doc__)
    parser.add_argument("--only", nargs="+", choices=sorted(AUDITS), default=None)
    args = parser.parse_args(argv)
    for name in args.only or list(AUDITS):
        start = time.perf_counter()
        run, write_report = AUDITS[name]
        run()
        write_report()
        print(f"{name}: done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
