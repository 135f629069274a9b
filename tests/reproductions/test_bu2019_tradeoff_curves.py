"""The trade-off curves of Bu et al. 2019: each setting's curves a run of dpcore.runs."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reproductions.bu2019_gdp import tradeoff_curves
from reproductions.harness import Output

TINY = tradeoff_curves.TradeoffConfig(
    settings=(
        tradeoff_curves.Setting("short: sigma 1, q 0.05, 20 steps", 0.05, 1.0, 20),
        tradeoff_curves.Setting("shorter: sigma 2, q 0.1, 10 steps", 0.1, 2.0, 10),
    ),
    alphas=20,
    grid_spacing=1e-3,
)


def test_curves_fanned_out_give_the_in_process_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here, threads = Output.under(tmp_path / "here"), Output.under(tmp_path / "threads")
    tradeoff_curves.compute(TINY, output=here)
    with ThreadPoolExecutor(2) as pool:
        tradeoff_curves.compute(TINY, output=threads, executor=pool)
    ours, theirs = (out.load_results(tradeoff_curves.STEM) for out in (here, threads))
    assert ours["rows"] == theirs["rows"] and ours["summary"] == theirs["summary"]
    assert [item["label"] for item in ours["summary"]] == [s.label for s in TINY.settings]
    for label in (s.label for s in TINY.settings):  # trade-off curves: in [0, 1], decreasing
        mine = [row for row in ours["rows"] if row["setting"] == label]
        for name in ("tight", "clt", "rdp_implied"):
            beta = [row[name] for row in mine]
            assert all(0.0 <= b <= 1.0 for b in beta)
            assert all(b >= c - 1e-9 for b, c in itertools.pairwise(beta))
    assert len(list(threads.store(tradeoff_curves.STEM).iterdir())) == 2

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("stored curves were computed again")

    monkeypatch.setattr(tradeoff_curves, "_tight_curve", refuse)
    with ThreadPoolExecutor(2) as pool:
        tradeoff_curves.compute(TINY, output=threads, executor=pool)
    assert threads.load_results(tradeoff_curves.STEM)["rows"] == ours["rows"]
