"""Benchmarks: ``nox -s bench`` (all) or ``nox -s bench -- accounting``; JSON in bench/results/."""
