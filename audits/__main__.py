"""``python -m audits [--only NAME ...]``: run the audits, save results, write the report."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from audits import mechanisms, report

AUDITS: dict[str, Callable[[], Any]] = {"mechanisms": mechanisms.run}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m audits", description=__doc__)
    parser.add_argument("--only", nargs="+", choices=sorted(AUDITS), default=None)
    args = parser.parse_args(argv)
    for name in args.only or list(AUDITS):
        start = time.perf_counter()
        AUDITS[name]()
        report.write(name)
        print(f"{name}: done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
