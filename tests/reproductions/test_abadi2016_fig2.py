"""Abadi et al. 2016, Fig. 2: each epoch count's epsilons a run of dpcore.runs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reproductions.abadi2016 import fig2
from reproductions.harness import Output

TINY = fig2.Fig2Config(epochs=(1, 5, 10), accountants=("moments", "rdp"))


def test_epoch_counts_fanned_out_give_the_in_process_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here, threads = Output.under(tmp_path / "here"), Output.under(tmp_path / "threads")
    fig2.compute(TINY, output=here)
    with ThreadPoolExecutor(2) as pool:
        fig2.compute(TINY, output=threads, executor=pool)
    ours, theirs = (out.load_results(fig2.STEM) for out in (here, threads))
    assert ours["rows"] == theirs["rows"]
    assert [(row["epochs"], row["steps"]) for row in ours["rows"]] == [
        (1, 100),
        (5, 500),
        (10, 1000),
    ]
    moments = [row["moments"] for row in ours["rows"]]
    assert moments == sorted(moments) and all(row["rdp"] > 0 for row in ours["rows"])
    assert len(list(threads.store(fig2.STEM).iterdir())) == 3

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a stored epoch count was accounted again")

    monkeypatch.setattr(fig2, "epsilon_report", refuse)
    with ThreadPoolExecutor(2) as pool:
        fig2.compute(TINY, output=threads, executor=pool)
    assert threads.load_results(fig2.STEM)["rows"] == ours["rows"]
