"""``python -m bench [NAME ...]``: run the named benchmarks (default: all)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import accounting

BENCHMARKS = {"accounting": accounting.run}
RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run, of {sorted(BENCHMARKS)}")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; expected names in {sorted(BENCHMARKS)}")
    for name in args.names or list(BENCHMARKS):
        rows = BENCHMARKS[name](RESULTS)
        print(json.dumps(rows, indent=1))
        print(f"wrote {RESULTS / (name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
