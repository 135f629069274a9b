"""CIFAR-10 runner of the Abadi et al. 2016 reproduction, on a tiny generated batch directory."""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpcore.accountants import MomentsAccountant
from dpcore.events import dpsgd_event
from reproductions.abadi2016 import cifar10, cifar10_training
from reproductions.abadi2016.cifar10 import CifarConfig, CifarSetting
from reproductions.harness import ROOT, Output

PER_BATCH = 64  # 5 training batches (320 images) and a test batch of 64
TINY_SETTING = CifarSetting(
    "tiny", lot_size=32, epochs=2, paper_epochs=3, paper_epsilon=2.0, paper_accuracy=0.67
)


def _write_batches(folder: Path) -> None:
    """The real python-pickle layout: dict with b"data" uint8 (n, 3072) and b"labels"."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = rng.integers(0, 10, size=PER_BATCH)
        data = rng.integers(0, 256, size=(PER_BATCH, 3072)).astype(np.uint8)
        data[:, :1024] = (labels * 25)[:, None].astype(np.uint8)  # a learnable red channel
        with (folder / name).open("wb") as handle:
            pickle.dump({b"data": data, b"labels": labels.tolist()}, handle)


def _tiny(directory: Path | None) -> CifarConfig:
    return CifarConfig(
        profile="test",
        directory=None if directory is None else str(directory),
        settings=(TINY_SETTING,),
        conv_channels=4,
        fc_units=8,
        eval_batch=50,
    )


@pytest.fixture
def readme(tmp_path: Path) -> Path:
    path = tmp_path / "README.md"
    path.write_text(f"a\n{cifar10.TABLE_START}\nold\n{cifar10.TABLE_END}\nb\n")
    return path


def test_runs_on_a_tiny_directory(tmp_path: Path, readme: Path) -> None:
    _write_batches(tmp_path / "cifar")
    output = Output.under(tmp_path)
    cifar10.compute(config=_tiny(tmp_path / "cifar"), output=output)
    saved = output.load_results("abadi2016_cifar10")
    assert saved["status"] == "run" and saved["n_train"] == 320 and saved["n_test"] == 64
    rows = saved["rows"]
    assert [row["epoch"] for row in rows] == [1, 2]
    assert [row["step"] for row in rows] == [10, 20]  # 320 / 32 lots per epoch
    assert all(0.0 <= row["test_accuracy"] <= 1.0 for row in rows)
    # q = 32 / 320, sigma = 6 (the paper's, §5.3), 20 steps.
    expected = MomentsAccountant().compose(
        dpsgd_event(sampling_probability=0.1, noise_multiplier=6.0, steps=20)
    )
    assert rows[-1]["epsilon_moments"] == pytest.approx(expected.get_epsilon(1e-5))
    assert rows[0]["epsilon_pld_upper"] is None and rows[-1]["epsilon_pld_upper"] > 0
    assert saved["summary"]["tiny"]["status"] == "done"
    assert not output.runs.exists()  # no run store unless the config asks for one
    statement = json.loads(output.path("abadi2016_cifar10_tiny_privacy.json").read_text())
    assert statement["steps"] == 20 and statement["dataset_size"] == 320
    assert statement["run"]["max_grad_norm"] == 3.0 and statement["run"]["engine"] == "fast"
    assert statement["epsilon"]["moments"]["epsilon"] == pytest.approx(rows[-1]["epsilon_moments"])
    cifar10.plot(output=output, readme=readme)
    assert output.path("abadi2016_cifar10.png").stat().st_size > 0
    table = readme.read_text()
    assert "old" not in table and "| tiny (32) | 2 (≈3) |" in table and "not run" not in table
    assert "| eps4_lot4000 (4000) | not in this profile (≈125) |" in table


def test_missing_directory_records_not_run(tmp_path: Path, readme: Path) -> None:
    output = Output.under(tmp_path)
    output.path("abadi2016_cifar10.png").write_bytes(b"stale")
    cifar10.compute(config=_tiny(tmp_path / "absent"), output=output)
    saved = output.load_results("abadi2016_cifar10")
    assert saved["status"] == "not run: data unavailable"
    assert "data_batch_1" in saved["error"] and saved["rows"] == [] and saved["summary"] == {}
    # Accounting needs no data: Fig. 6's settings are still reported (lot 2,000, ~56 epochs).
    expected = MomentsAccountant().compose(
        dpsgd_event(sampling_probability=0.04, noise_multiplier=6.0, steps=56 * 25)
    )
    assert saved["paper_accounting"]["eps2_lot2000"]["moments"] == pytest.approx(
        expected.get_epsilon(1e-5)
    )
    cifar10.plot(output=output, readme=readme)
    assert not output.path("abadi2016_cifar10.png").exists()
    table = readme.read_text()
    assert "| eps2_lot2000 (2000) | not run: data unavailable (≈56) | - | 0.67 | - |" in table
    assert "| eps8_lot4000 (4000) | not run: data unavailable (≈665) | - | 0.73 | - |" in table
    assert "data_batch_1" in table


def test_deadline_saves_a_summary_that_says_it_stopped(tmp_path: Path, readme: Path) -> None:
    _write_batches(tmp_path / "cifar")
    output = Output.under(tmp_path)
    cifar10.compute(config=_tiny(tmp_path / "cifar"), output=output, deadline=0.0)
    saved = output.load_results("abadi2016_cifar10")
    assert saved["status"] == "run" and saved["rows"] == []
    item = saved["summary"]["tiny"]
    assert item["status"] == "stopped at epoch 0 of 2 (deadline)"
    assert item["test_accuracy"] is None and item["privacy_statement"] is None
    cifar10.plot(output=output, readme=readme)
    assert "| tiny (32) | 0, stopped at epoch 0 of 2 (deadline) (≈3) | - |" in readme.read_text()


def test_plot_reads_the_committed_results(tmp_path: Path, readme: Path) -> None:
    output = Output.under(tmp_path)
    output.figures.mkdir(parents=True)
    shutil.copy(ROOT / "figures" / "abadi2016_cifar10.json", output.figures)
    cifar10.plot(output=output, readme=readme)
    assert "| eps2_lot2000 (2000) |" in readme.read_text()


def test_directory_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cifar10.ENVIRONMENT, str(tmp_path / "env"))
    assert cifar10.data_directory(_tiny(None)) == tmp_path / "env"
    assert cifar10.data_directory(_tiny(tmp_path / "own")) == tmp_path / "own"
    monkeypatch.delenv(cifar10.ENVIRONMENT)
    assert cifar10.data_directory(_tiny(None)).name == "cifar-10-batches-py"


def test_model_shapes_and_preprocessing() -> None:
    config = CifarConfig()
    model = cifar10.make_model(config)
    # §5.3: 12x12x64 after the first block, 6x6x64 after the second, 384, 384, 10.
    x = torch.zeros(2, 3, 24, 24)
    assert model[:3](x).shape == (2, 64, 12, 12) and model[:6](x).shape == (2, 64, 6, 6)
    assert model(x).shape == (2, 10)
    images = np.random.default_rng(1).integers(0, 256, size=(7, 3, 32, 32)).astype(np.uint8)
    fixed = cifar10.evaluation_inputs(images, 24)
    assert fixed.shape == (7, 3, 24, 24)
    np.testing.assert_allclose(fixed.reshape(7, -1).mean(1), 0.0, atol=1e-5)
    np.testing.assert_allclose(fixed.reshape(7, -1).std(1, correction=0), 1.0, atol=1e-4)
    assert torch.equal(fixed, cifar10.evaluation_inputs(images, 24))  # deterministic at test time
    one = cifar10.augment(images, 24, np.random.default_rng(5))
    two = cifar10.augment(images, 24, np.random.default_rng(5))
    other = cifar10.augment(images, 24, np.random.default_rng(6))
    assert one.shape == (7, 3, 24, 24) and torch.equal(one, two) and not torch.equal(one, other)


class InterruptError(Exception):
    """Raised by the patched evaluator to simulate a crash."""


def _evaluations(monkeypatch: pytest.MonkeyPatch, *, crash_at: int | None = None) -> list[int]:
    """Count the evaluator's calls (two per epoch: test, then train); raise at call ``crash_at``."""
    calls: list[int] = []
    original: Callable[..., float] = cifar10_training.evaluate

    def counting(*args: Any, **kwargs: Any) -> float:
        calls.append(len(calls) + 1)
        if calls[-1] == crash_at:
            raise InterruptError
        return original(*args, **kwargs)

    monkeypatch.setattr(cifar10_training, "evaluate", counting)
    return calls


def test_interrupted_setting_resumes_to_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_batches(tmp_path / "cifar")
    x_train, y_train = cifar10.load_cifar10(tmp_path / "cifar", "train")
    x_test, y_test = cifar10.load_cifar10(tmp_path / "cifar", "test")
    data = (x_train, torch.as_tensor(y_train), x_test, torch.as_tensor(y_test))
    config = dataclasses.replace(_tiny(tmp_path / "cifar"), checkpoint=True)
    reference, _ = cifar10.train_setting(config, TINY_SETTING, data, store=tmp_path / "reference")

    store = tmp_path / "runs"
    _evaluations(monkeypatch, crash_at=3)  # killed while evaluating epoch 2
    with pytest.raises(InterruptError):
        cifar10.train_setting(config, TINY_SETTING, data, store=store)
    (folder,) = store.iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint-10.pt", "state.json"]
    calls = _evaluations(monkeypatch)
    resumed, statement = cifar10.train_setting(config, TINY_SETTING, data, store=store)
    assert len(calls) == 2  # only epoch 2 (its distortions redrawn from the seed and epoch)
    assert resumed.done and statement is not None and statement["steps"] == 20
    strip = [{k: v for k, v in row.items() if k != "wall_s"} for row in reference.rows]
    assert [{k: v for k, v in row.items() if k != "wall_s"} for row in resumed.rows] == strip
    # The same weights, bit for bit.
    assert reference.checkpoint_path is not None and resumed.checkpoint_path is not None
    theirs = torch.load(reference.checkpoint_path, weights_only=True)["model"]
    ours = torch.load(resumed.checkpoint_path, weights_only=True)["model"]
    for key, value in theirs.items():
        torch.testing.assert_close(ours[key], value, rtol=0, atol=0)
    # Finished: read back without training or evaluating.
    _evaluations(monkeypatch, crash_at=1)
    again, _ = cifar10.train_setting(config, TINY_SETTING, data, store=store)
    assert again.rows == resumed.rows


def test_settings_fanned_out_on_threads_give_the_in_process_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two settings trained at once on a thread pool, into the run store, give the rows trained
    here one after another; run again on the same store, nothing trains."""
    from concurrent.futures import ThreadPoolExecutor

    _write_batches(tmp_path / "cifar")
    other = dataclasses.replace(TINY_SETTING, name="tiny64", lot_size=64, epochs=1)
    config = dataclasses.replace(_tiny(tmp_path / "cifar"), settings=(TINY_SETTING, other))
    here, threads = Output.under(tmp_path / "here"), Output.under(tmp_path / "threads")
    cifar10.compute(config=config, output=here)
    with ThreadPoolExecutor(2) as pool:
        cifar10.compute(config=config, output=threads, executor=pool)
    ours, theirs = (out.load_results("abadi2016_cifar10") for out in (here, threads))

    def untimed(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "wall_s"} for row in rows]

    assert untimed(ours["rows"]) == untimed(theirs["rows"]) and len(ours["rows"]) == 3
    assert ours["summary"] == theirs["summary"]
    assert theirs["runs_spread"] == "fanned out on ThreadPoolExecutor"
    assert len(list(threads.store("abadi2016_cifar10").iterdir())) == 2
    calls: list[object] = []
    monkeypatch.setattr(cifar10_training, "evaluate", lambda *args, **kwargs: calls.append(args))
    with ThreadPoolExecutor(2) as pool:
        cifar10.compute(config=config, output=threads, executor=pool)
    assert calls == [] and threads.load_results("abadi2016_cifar10")["rows"] == theirs["rows"]
