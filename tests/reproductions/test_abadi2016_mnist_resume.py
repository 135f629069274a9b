"""Resumable MNIST runs of the Abadi et al. 2016 reproduction, on generated data (no real data)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpcore.accountants import MomentsAccountant
from dpcore.events import ComposedEvent, GaussianEvent, dpsgd_event
from reproductions.abadi2016 import mnist, mnist_core
from reproductions.abadi2016.mnist_core import MnistConfig, steps_within_budget
from reproductions.harness import ROOT, NonPrivateTrainer, Output
from tests.reproductions.mnist_images import patterned_digits

#: Tiny sizes: 200 training images of 6 x 6 pixels, lots of 20 (q = 0.1, 10 steps per epoch).
TINY = MnistConfig(
    epochs=(2, 2, 2),
    paper_epochs=(1, 1, 1),
    baseline_epochs=2,
    lot_size=20,
    hidden_units=8,
    pca_components=4,
)


_fake_mnist = patterned_digits(6, 200, 50)


class InterruptError(Exception):
    """Raised by the patched evaluator to simulate a crash."""


def _without_wall(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in rows]


def _evaluations(monkeypatch: pytest.MonkeyPatch, *, crash_at: int | None = None) -> list[int]:
    """Count the evaluator's calls (two per row: test, then train); raise at call ``crash_at``."""
    calls: list[int] = []
    original: Callable[..., float] = mnist_core.evaluate

    def counting(*args: Any, **kwargs: Any) -> float:
        calls.append(len(calls) + 1)
        if calls[-1] == crash_at:
            raise InterruptError
        return original(*args, **kwargs)

    monkeypatch.setattr(mnist_core, "evaluate", counting)
    return calls


def _pca_calls(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The noise of every PCA drawn from now on (the baseline's exact PCA has noise 0)."""
    calls: list[float] = []
    original = mnist_core.dp_pca_directions

    def counting(*args: Any, **kwargs: Any) -> np.ndarray:
        calls.append(kwargs["noise_std"])
        return original(*args, **kwargs)

    monkeypatch.setattr(mnist_core, "dp_pca_directions", counting)
    return calls


def _states(store: Path) -> dict[str, dict[str, Any]]:
    """Each run folder's saved state, by the run's name."""
    states = {}
    for path in store.glob("*/state.json"):
        state = json.loads(path.read_text())
        run = state["spec"]["run"]
        states[run if isinstance(run, str) else run["name"]] = {**state, "folder": path.parent}
    return states


@pytest.fixture(autouse=True)
def _generated_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mnist_core, "load_mnist", _fake_mnist)


def test_interrupted_run_resumes_to_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = mnist.run(TINY, store=tmp_path / "reference")  # uninterrupted
    store = tmp_path / "runs"
    # Killed while evaluating medium's second epoch: large has 2 rows (4 calls), medium 1 (2).
    _evaluations(monkeypatch, crash_at=7)
    with pytest.raises(InterruptError):
        mnist.run(TINY, store=store)
    states = _states(store)
    assert sorted(states) == ["large", "medium"]
    assert states["large"]["done"] and len(states["large"]["rows"]) == 2
    assert not states["medium"]["done"] and [r["step"] for r in states["medium"]["rows"]] == [10]
    medium = states["medium"]["folder"]
    assert sorted(p.name for p in medium.iterdir()) == [
        "checkpoint-10.pt",
        "projection.npy",
        "state.json",
    ]

    # The restart must not release a second PCA: only the level that had not started draws one
    # (and the baseline its exact, noiseless PCA).
    pca = _pca_calls(monkeypatch)
    calls = _evaluations(monkeypatch)
    resumed = mnist.run(TINY, store=store)
    assert pca == [TINY.pca_noise[2], 0.0]
    assert len(calls) == 2 * 5  # medium's epoch 2, small's two epochs, the baseline's two
    assert _without_wall(resumed["rows"]) == _without_wall(reference["rows"])
    for name in mnist.LEVELS:
        assert (
            resumed["statements"][name]["epsilon_with_pca"]
            == reference["statements"][name]["epsilon_with_pca"]
        )
        assert resumed["summary"][name]["status"] == "done"
    # The same weights, bit for bit (the schedule and the noise continued where they stopped).
    finished = _states(store)
    for name, state in _states(tmp_path / "reference").items():
        ours = torch.load(finished[name]["folder"] / "checkpoint-20.pt", weights_only=True)
        theirs = torch.load(state["folder"] / "checkpoint-20.pt", weights_only=True)
        for key, value in theirs["model"].items():
            torch.testing.assert_close(ours["model"][key], value, rtol=0, atol=0)
    # A further restart trains and evaluates nothing and returns the same rows.
    _evaluations(monkeypatch, crash_at=1)
    again = mnist.run(TINY, store=store)
    assert again["rows"] == resumed["rows"]
    assert again["statements"]["small"] == resumed["statements"]["small"]


def test_missing_projection_starts_the_run_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = mnist.run(TINY)
    store = tmp_path / "runs"
    _evaluations(monkeypatch, crash_at=3)  # large has its first row, then dies
    with pytest.raises(InterruptError):
        mnist.run(TINY, store=store)
    large = _states(store)["large"]
    assert len(large["rows"]) == 1
    (large["folder"] / "projection.npy").unlink()  # rows whose projection was lost
    pca = _pca_calls(monkeypatch)
    calls = _evaluations(monkeypatch)
    resumed = mnist.run(TINY, store=store)
    assert pca == [*TINY.pca_noise, 0.0]  # large drew its projection again
    assert len(calls) == 2 * 8  # every row of every run, large's first one included
    assert _without_wall(resumed["rows"]) == _without_wall(reference["rows"])
    assert sorted(p.name for p in large["folder"].iterdir()) == [
        "checkpoint-20.pt",
        "projection.npy",
        "state.json",
    ]


def test_changed_setting_does_not_reuse_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "runs"
    mnist.run(TINY, store=store)
    assert len(list(store.iterdir())) == 4  # three levels and the baseline
    calls = _evaluations(monkeypatch)
    mnist.run(dataclasses.replace(TINY, max_grad_norm=2.0), store=store)
    assert len(calls) == 2 * 8  # every run retrained, none read back
    assert len(list(store.iterdir())) == 8


def test_rows_and_accounting_of_a_tiny_run() -> None:
    result = mnist.run(TINY)
    rows = [row for row in result["rows"] if row["run"] == "large"]
    assert [row["step"] for row in rows] == [10, 20] and [row["epoch"] for row in rows] == [1, 2]
    # Training alone: the moments accountant on q = 20/200 = 0.1, sigma = 8, 20 steps.
    expected = MomentsAccountant().compose(
        dpsgd_event(sampling_probability=0.1, noise_multiplier=8.0, steps=20)
    )
    assert rows[-1]["epsilon_moments"] == pytest.approx(expected.get_epsilon(1e-5))
    # With the PCA on every image (sample rate 1): an unsampled Gaussian with sigma_p = 16.
    total = MomentsAccountant().compose(
        ComposedEvent(
            [
                GaussianEvent(16.0),
                dpsgd_event(sampling_probability=0.1, noise_multiplier=8, steps=20),
            ]
        )
    )
    assert rows[-1]["epsilon_moments_with_pca"] == pytest.approx(total.get_epsilon(1e-5))
    assert rows[-1]["epsilon_moments_with_pca"] > rows[-1]["epsilon_moments"]
    summary = result["summary"]["large"]
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    assert (
        summary["epochs_to_paper_epsilon_moments"]["with_pca"]
        <= (summary["epochs_to_paper_epsilon_moments"]["training_only"])
    )
    baseline = [row for row in result["rows"] if row["run"] == "non-private"]
    assert [row["step"] for row in baseline] == [10, 20] and baseline[0]["epsilon_moments"] is None


def _readme(tmp_path: Path) -> Path:
    readme = tmp_path / "README.md"
    readme.write_text(
        f"a\n{mnist.TABLE_START}\nold\n{mnist.TABLE_END}\n"
        "<!-- mnist-full-table:start -->\nold full\n<!-- mnist-full-table:end -->\nb\n"
    )
    return readme


def test_compute_and_plot_write_results_statements_and_table(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    mnist.compute(config=TINY, output=output)
    saved = output.load_results("abadi2016_mnist")
    assert len(saved["rows"]) == 4 * 2 and not saved["resumable"]
    assert not output.runs.exists()  # the quick profile keeps no run store
    for name in mnist.LEVELS:
        item = saved["summary"][name]
        assert item["status"] == "done" and item["epochs_run"] == 2
        statement = json.loads(output.path(item["privacy_statement"]).read_text())
        assert statement["epsilon_with_pca"] == item["epsilon_with_pca"]
        assert statement["steps"] == 20
    readme = _readme(tmp_path)
    mnist.plot(output=output, readme=readme)
    assert output.path("abadi2016_mnist_accuracy.png").stat().st_size > 0
    text = readme.read_text()
    assert "\nold\n" not in text and "old full" in text
    assert "| large (8, 16) | 2 (≈1) |" in text and "| non-private (exact PCA) | 2 (≈100) |" in text


def test_deadline_saves_a_summary_that_says_it_stopped(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    mnist.compute(config=TINY, output=output, deadline=0.0)
    saved = output.load_results("abadi2016_mnist")
    assert saved["rows"] == []
    for name in (*mnist.LEVELS, "non-private"):
        assert saved["summary"][name]["status"] == "stopped at epoch 0 of 2 (deadline)"
        assert saved["summary"][name]["test_accuracy"] is None
    assert saved["summary"]["large"]["privacy_statement"] is None
    assert not list(output.figures.glob("*_privacy.json"))  # no step taken: nothing to state
    # The accounting of the paper's epochs needs no training.
    assert saved["summary"]["large"]["epsilon_paper_epochs_with_pca"]["moments"] > 0
    readme = _readme(tmp_path)
    mnist.plot(output=output, readme=readme)
    text = readme.read_text()
    assert (
        "| large (8, 16) | 0, stopped at epoch 0 of 2 (deadline) (≈1) | - | 0.90 | - / - |" in text
    )


def test_plot_draws_the_committed_full_results(tmp_path: Path) -> None:
    # figures/abadi2016_mnist_full.json was written by the code before the harness (rows with
    # "steps", no "status"): plot must still draw it and write its table.
    output = Output.under(tmp_path)
    output.figures.mkdir(parents=True)
    shutil.copy(ROOT / "figures" / "abadi2016_mnist_full.json", output.figures)
    readme = _readme(tmp_path)
    mnist.plot(output=output, readme=readme)
    assert output.path("abadi2016_mnist_full_accuracy.png").stat().st_size > 10_000
    text = readme.read_text()
    assert "| large (8, 16) | 16 (≈16) | 0.893 | 0.90 | 0.40 / 0.47 |" in text
    assert "| non-private (exact PCA) | 100 (≈100) | 0.976 | 0.983 |" in text


def test_steps_within_budget_brackets_the_target() -> None:
    # Fig. 2 setting of Abadi et al. 2016 (q = 0.01, sigma = 4): the paper's moments accountant
    # gives 1.26 at E = 100 (§5.1), so a budget of 1.26 allows about 10,000 steps.
    steps = steps_within_budget(
        sampling_probability=0.01, noise_multiplier=4.0, target_epsilon=1.26, delta=1e-5
    )
    assert 9_000 <= steps <= 11_000

    def eps(t: int) -> float:
        event = dpsgd_event(sampling_probability=0.01, noise_multiplier=4.0, steps=t)
        return MomentsAccountant().compose(event).get_epsilon(1e-5)

    assert eps(steps) <= 1.26 < eps(steps + 1)
    # An extra release that alone exceeds the budget leaves no steps.
    assert (
        steps_within_budget(
            sampling_probability=0.01,
            noise_multiplier=4.0,
            target_epsilon=0.3,
            delta=1e-5,
            extra=GaussianEvent(1.0),
        )
        == 0
    )


def _baseline_trainer() -> mnist_core.ScheduledTrainer:
    data = mnist_core.load_data()
    inputs = mnist_core.project(data[0], None)
    torch.manual_seed(0)
    trainer = NonPrivateTrainer(
        mnist_core.make_model(TINY, inputs.shape[1]),
        inputs,
        data[1],
        optimizer=lambda params: torch.optim.SGD(params, lr=1.0),
        loss_fn=torch.nn.CrossEntropyLoss(),
        batch_size=20,
        seed=0,
    )
    return mnist_core.ScheduledTrainer(trainer, trainer.optimizer, lambda done: 0.1 / (1 + done))


def test_the_schedule_survives_a_checkpoint(tmp_path: Path) -> None:
    reference = _baseline_trainer()
    for _ in range(6):
        reference.step()
    first = _baseline_trainer()
    for _ in range(3):
        first.step()
    first.save_checkpoint(tmp_path / "c.pt")
    resumed = _baseline_trainer()
    resumed.load_checkpoint(tmp_path / "c.pt")  # replaces the optimizer's param_groups
    for _ in range(3):
        resumed.step()
    assert resumed.optimizer.param_groups[0]["lr"] == 0.1 / 6  # the rate of step 6, not 3
    for a, b in zip(resumed.model.parameters(), reference.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_runs_fanned_out_on_threads_give_the_in_process_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The noise levels and the baseline trained at once on a thread pool, into the run store,
    give the rows trained here one after another; run again on the same store, nothing trains."""
    from concurrent.futures import ThreadPoolExecutor

    here, threads = Output.under(tmp_path / "here"), Output.under(tmp_path / "threads")
    mnist.compute(config=TINY, output=here)
    with ThreadPoolExecutor(2) as pool:
        mnist.compute(config=TINY, output=threads, executor=pool)
    ours, theirs = (out.load_results("abadi2016_mnist") for out in (here, threads))
    assert _without_wall(ours["rows"]) == _without_wall(theirs["rows"])
    assert len(ours["rows"]) == 4 * 2 and theirs["resumable"]

    def untimed(summary: dict[str, Any]) -> dict[str, Any]:
        return {
            name: {k: v for k, v in item.items() if k != "wall_s"} for name, item in summary.items()
        }

    assert untimed(ours["summary"]) == untimed(theirs["summary"])
    assert theirs["runs_spread"] == "fanned out on ThreadPoolExecutor"
    assert len(list(threads.store("abadi2016_mnist").iterdir())) == 4
    calls: list[object] = []
    monkeypatch.setattr(mnist_core, "evaluate", lambda *args, **kwargs: calls.append(args))
    with ThreadPoolExecutor(2) as pool:
        mnist.compute(config=TINY, output=threads, executor=pool)
    assert calls == [] and threads.load_results("abadi2016_mnist")["rows"] == theirs["rows"]
