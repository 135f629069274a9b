"""Resumable MNIST runs of the Abadi et al. 2016 reproduction, on generated data (no real data)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpcore.accountants import MomentsAccountant
from dpcore.events import ComposedEvent, GaussianEvent, dpsgd_event
from reproductions.abadi2016 import mnist, mnist_core
from reproductions.abadi2016.mnist_core import MnistConfig, steps_within_budget

#: Tiny sizes: 200 training images of 6 x 6 pixels, lots of 20 (q = 0.1, 10 steps per epoch).
TINY = MnistConfig(
    profile="test",
    epochs=(2, 2, 2),
    paper_epochs=(1, 1, 1),
    baseline_epochs=2,
    lot_size=20,
    hidden_units=8,
    pca_components=4,
    checkpoint_every=1,
)


def _fake_mnist(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Ten classes, each a fixed random 6 x 6 pattern plus noise, as uint8 images."""
    rng = np.random.default_rng(0 if split == "train" else 1)
    patterns = np.random.default_rng(7).uniform(0, 200, size=(10, 6, 6))
    n = 200 if split == "train" else 50
    labels = rng.integers(0, 10, size=n)
    images = patterns[labels] + rng.uniform(0, 55, size=(n, 6, 6))
    return images.astype(np.uint8), labels.astype(np.int64)


class InterruptError(Exception):
    """Raised by the epoch hook to simulate a crash."""


def _without_wall(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in rows]


@pytest.fixture(autouse=True)
def _generated_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mnist_core, "load_mnist", _fake_mnist)


def test_interrupted_run_resumes_to_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = mnist.run(TINY)  # no checkpoints at all
    seen: list[tuple[str, int]] = []

    def crash_in_medium(name: str, epoch: int) -> None:
        seen.append((name, epoch))
        if (name, epoch) == ("medium", 1):
            raise InterruptError

    with pytest.raises(InterruptError):
        mnist.run(TINY, checkpoint_dir=tmp_path, on_epoch=crash_in_medium)
    assert seen == [("large", 1), ("large", 2), ("medium", 1)]
    assert (tmp_path / "medium_projection.npy").is_file()

    # The restart must not release a second PCA: count the calls of the DP-PCA.
    calls: list[float] = []
    original = mnist_core.dp_pca_directions

    def counting(*args: Any, **kwargs: Any) -> np.ndarray:
        calls.append(kwargs["noise_std"])
        return original(*args, **kwargs)

    monkeypatch.setattr(mnist_core, "dp_pca_directions", counting)
    seen.clear()
    resumed = mnist.run(TINY, checkpoint_dir=tmp_path, on_epoch=lambda n, e: seen.append((n, e)))
    rest = [("medium", 2), ("small", 1), ("small", 2), ("non-private", 1), ("non-private", 2)]
    assert seen == rest
    assert calls == [TINY.pca_noise[2]]  # only the level that had not started
    assert _without_wall(resumed["rows"]) == _without_wall(reference["rows"])
    for name in mnist.LEVELS:
        assert (
            resumed["statements"][name]["epsilon_with_pca"]
            == reference["statements"][name]["epsilon_with_pca"]
        )
    # A further restart trains nothing and returns the same rows.
    seen.clear()
    again = mnist.run(TINY, checkpoint_dir=tmp_path, on_epoch=lambda n, e: seen.append((n, e)))
    assert seen == []
    assert again["rows"] == resumed["rows"]


def test_changed_setting_does_not_reuse_a_checkpoint(tmp_path: Path) -> None:
    mnist.run(TINY, checkpoint_dir=tmp_path)
    seen: list[tuple[str, int]] = []
    other = dataclasses.replace(TINY, max_grad_norm=2.0)
    mnist.run(other, checkpoint_dir=tmp_path, on_epoch=lambda n, e: seen.append((n, e)))
    assert ("large", 1) in seen  # retrained, not read back


def test_rows_and_accounting_of_a_tiny_run() -> None:
    result = mnist.run(TINY)
    rows = [row for row in result["rows"] if row["run"] == "large"]
    assert [row["steps"] for row in rows] == [10, 20]
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
