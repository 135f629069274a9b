"""The convex ERM reproduction's runs go through dpcore.runs: in process, or fanned out on an
executor into the run store, with the same rows; a rerun on the store computes nothing."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from dpcore.errors import InvalidParameterError
from reproductions.erm import excess_risk, median_audit
from reproductions.harness import Output

TINY = excess_risk.ErmConfig(
    datasets=("tiny",),
    max_train=150,
    epsilons=(0.5, 2.0),
    seeds=(0, 1),
    regularisation=1e-2,
    lambda_sweep=(1e-2, 1e-1),
    dpsgd_lot_size=50,
    dpsgd_epochs=1,
)


def _tiny() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """200 training and 100 test rows of norm 1 in 6 dimensions, labels +-1 (mostly by x_0)."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(300, 6))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = np.where(x[:, 0] + 0.3 * rng.normal(size=300) > 0, 1.0, -1.0)
    return (x[:200], y[:200]), (x[200:], y[200:])


@pytest.fixture(autouse=True)
def _tiny_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(excess_risk.LOADERS, "tiny", _tiny)


def test_excess_risk_seeds_fanned_out_give_the_in_process_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here, threads = Output.under(tmp_path / "here"), Output.under(tmp_path / "threads")
    excess_risk.compute(config=TINY, output=here)
    assert not here.runs.exists()  # in process: no run store
    with ThreadPoolExecutor(2) as pool:
        excess_risk.compute(config=TINY, output=threads, executor=pool)
    ours, theirs = (out.load_results(excess_risk.STEM) for out in (here, threads))
    assert ours["rows"] == theirs["rows"]
    methods, swept = len(excess_risk.METHODS), len(excess_risk.SWEPT)
    releases = 2 * (2 * methods + 2 * swept)  # seeds x (epsilons x methods + lambdas x swept)
    assert len([row for row in ours["rows"] if row["seed"] in (0, 1)]) == releases
    # epsilon by epsilon: the bounds, then seed 0's releases, then seed 1's
    first = [(row["method"], row["seed"]) for row in ours["rows"] if row["epsilon"] == 0.5]
    assert first[3:] == [(m, s) for s in (0, 1) for m in excess_risk.METHODS]
    assert theirs["runs_spread"] == "fanned out on ThreadPoolExecutor"
    assert len(list(threads.store(excess_risk.STEM).iterdir())) == 2  # one run per seed

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a stored release was computed again")

    monkeypatch.setattr(excess_risk, "_release", refuse)
    with ThreadPoolExecutor(2) as pool:
        excess_risk.compute(config=TINY, output=threads, executor=pool)
    assert threads.load_results(excess_risk.STEM)["rows"] == ours["rows"]


def test_the_median_audit_is_one_run_kept_in_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = median_audit.MedianAuditConfig(trials=2000, epsilons=(0.5, 2.0))
    here, threads = Output.under(tmp_path / "here"), Output.under(tmp_path / "threads")
    median_audit.compute(config=config, output=here)
    with ThreadPoolExecutor(1) as pool:
        median_audit.compute(config=config, output=threads, executor=pool)
    ours, theirs = (out.load_results(median_audit.STEM) for out in (here, threads))
    assert ours["rows"] == theirs["rows"] and len(ours["rows"]) == 2
    assert [row["claimed_epsilon"] for row in ours["rows"]] == [0.5, 2.0]
    assert len(list(threads.store(median_audit.STEM).iterdir())) == 1

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the stored audit was run again")

    monkeypatch.setattr(median_audit, "naive_median_release", refuse)
    with ThreadPoolExecutor(1) as pool:
        median_audit.compute(config=config, output=threads, executor=pool)
    assert threads.load_results(median_audit.STEM)["rows"] == ours["rows"]


def test_a_bad_executor_is_refused_before_anything_runs(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    with pytest.raises(InvalidParameterError, match="executor"):
        excess_risk.compute(config=TINY, output=output, executor="threads:2")
    with pytest.raises(InvalidParameterError, match="executor"):
        median_audit.compute(output=output, executor="threads:2")
    assert not output.figures.exists() and not output.runs.exists()
