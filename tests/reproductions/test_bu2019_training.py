"""DP training of Bu, Dong, Long, Su (2019/2020), Sec. 5: models, data pipelines, compute/plot.

Everything runs on tiny generated data (loaders monkeypatched), never the real datasets.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from dpcore.errors import InvalidParameterError
from dpcore.runs.markers import write_between_markers
from dpcore.torch.per_example.fast import fast_path_supports
from dpcore.torch.training import DPTrainer
from reproductions.bu2019_gdp import data, models, training, training_report, training_runs
from reproductions.bu2019_gdp.data import TaskData
from reproductions.bu2019_gdp.settings import SETTINGS, Setting
from reproductions.harness import NonPrivateTrainer, Output, evaluate, torch_seeded

# ----------------------------------------------------------------------------- models


def test_parameter_counts_match_the_papers_architectures() -> None:
    # Counts follow from the layer sizes of Sec. 5 (widths as in the authors' scripts):
    # MNIST CNN 16@8x8 (1,040) + 32@4x4 (8,224) + 512x32 (16,416) + 32x10 (330) = 26,010.
    assert models.parameter_count(models.mnist_cnn()) == 26_010
    # IMDb: 10,000 x 16 embedding + 16x16 (+16) + 16x2 (+2) = 160,000 + 272 + 34.
    assert models.parameter_count(models.imdb_model()) == 160_306
    # Adult on LIBSVM's 123 features: 123x16 (+16) + 16x2 (+2) = 2,018.
    assert models.parameter_count(models.adult_mlp(123)) == 2_018
    # ML-1M (6,040 users, 3,706 movies): (6,040 + 3,706) x (5 + 10) + 25x5 (+5) = 146,320.
    assert models.parameter_count(models.movielens_ncf()) == 146_320
    # ML-100K substitute (943 users, 1,682 movies): 2,625 x 15 + 130.
    assert models.parameter_count(models.movielens_ncf(943, 1682)) == 39_505


def test_models_are_fast_path_and_shapes() -> None:
    cases = [
        (models.mnist_cnn(), torch.zeros(3, 1, 28, 28), 10),
        (models.imdb_model(50), torch.randint(0, 50, (3, 12)), 2),
        (models.adult_mlp(7), torch.zeros(3, 7), 2),
        (models.movielens_ncf(6, 9), torch.tensor([[0, 0], [5, 8], [2, 3]]), 5),
    ]
    for model, x, classes in cases:
        assert fast_path_supports(model)
        assert tuple(model(x).shape) == (3, classes)


def test_evaluate_accuracy_and_rmse() -> None:
    linear = torch.nn.Linear(2, 5, bias=False)
    with torch.no_grad():
        linear.weight.zero_()
        linear.weight[4, 0] = 100.0  # x = (1, 0) -> 5 stars; x = (0, 1) -> uniform, 3 stars
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([4, 0])  # true stars 5 and 1: errors 0 and 2
    assert evaluate(linear, x, y, metric="rmse", batch=1) == pytest.approx(math.sqrt(2.0))
    # argmax: class 4, then class 0 (first of equal logits); one of the two labels is right
    assert evaluate(linear, x, torch.tensor([4, 3]), metric="accuracy", batch=2) == 0.5
    with pytest.raises(InvalidParameterError):
        evaluate(linear, x, y, metric="auc", batch=2)
    with pytest.raises(InvalidParameterError):
        models.build_model("cifar10", {})


# ----------------------------------------------------------------------------- data


def _adult_row(age: str, work: str, gain: str) -> list[str]:
    return [age, work, "1", "HS", "9", "never", "clerk", "own", "white", "M", gain, "0", "40", "US"]


def test_adult_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    train = [_adult_row("20", "A", "0"), _adult_row("40", "B", "99"), _adult_row("60", "A", "0")]
    test = [_adult_row("40", "Z", "0")]  # workclass never seen in training
    splits = {"train": (train, np.array([0, 1, 0])), "test": (test, np.array([1]))}
    monkeypatch.setattr(data, "load_adult", lambda split: splits[split])
    task = data.adult()
    # 5 numeric columns + workclass {A, B} + 7 one-category columns
    assert task.info["in_features"] == 5 + 2 + 7 == task.x_train.shape[1]
    assert torch.allclose(task.x_train[:, :5].mean(0), torch.zeros(5), atol=1e-6)
    assert task.x_train[:, 0].tolist() == pytest.approx([-1.2247449, 0.0, 1.2247449])
    assert task.x_train[1, 2] > 0  # log1p(99) standardised, above the mean
    assert task.x_test[0, 5:7].tolist() == [0.0, 0.0]  # unseen category: all zeros
    assert task.y_train.tolist() == [0, 1, 0] and task.y_test.dtype == torch.long


def test_movielens_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    ratings = np.stack(
        [rng.integers(10, 20, 200), rng.integers(100, 130, 200), rng.integers(1, 6, 200)], 1
    ).astype(float)
    ratings = np.hstack([ratings, np.zeros((200, 1))])
    monkeypatch.setattr(data, "load_movielens_100k", lambda: ratings)
    task = data.movielens(seed=3)
    assert (len(task.x_train), len(task.x_test)) == (160, 40)  # the paper's 80/20 split
    assert task.info == {"users": len(set(ratings[:, 0])), "items": len(set(ratings[:, 1]))}
    assert int(task.x_train[:, 0].max()) < task.info["users"]
    assert set(task.y_train.tolist()) <= {0, 1, 2, 3, 4}
    again = data.movielens(seed=3)
    assert torch.equal(again.x_test, task.x_test)  # fixed seed, same split
    # every rating lands in exactly one split: the multisets of (user, item, stars) agree
    users, items = np.unique(ratings[:, 0]), np.unique(ratings[:, 1])

    def triples(x: torch.Tensor, y: torch.Tensor) -> list[tuple[int, int, int]]:
        return [
            (int(users[u]), int(items[i]), r + 1)
            for (u, i), r in zip(x.tolist(), y.tolist(), strict=True)
        ]

    split = triples(task.x_train, task.y_train) + triples(task.x_test, task.y_test)
    assert sorted(split) == sorted((int(u), int(i), int(r)) for u, i, r, _ in ratings)
    with pytest.raises(InvalidParameterError):
        data.movielens(test_fraction=1.0)
    monkeypatch.setattr(data, "load_movielens_100k", lambda: ratings * [1, 1, 1.5, 1])
    with pytest.raises(InvalidParameterError):
        data.movielens()


def test_imdb_and_mnist_pipelines(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, int] = {}

    def fake_sequences(vocab_size: int, length: int) -> tuple[np.ndarray, ...]:
        calls.update(vocab_size=vocab_size, length=length)
        ids = np.zeros((4, length), dtype=np.int64)
        return ids, np.array([0, 1, 0, 1]), ids[:2], np.array([1, 0])

    monkeypatch.setattr(data, "imdb_sequences", fake_sequences)
    task = data.imdb()
    assert calls == {"vocab_size": 10_000, "length": 256}  # Sec. 5.2's vocabulary and length
    assert tuple(task.x_train.shape) == (4, 256) and task.info["vocab_size"] == 10_000
    images = {"train": np.full((3, 28, 28), 255, np.uint8), "test": np.zeros((2, 28, 28), np.uint8)}
    monkeypatch.setattr(
        data, "load_mnist", lambda split: (images[split], np.arange(len(images[split])))
    )
    mnist = data.mnist()
    assert tuple(mnist.x_train.shape) == (3, 1, 28, 28) and float(mnist.x_train.max()) == 1.0


def test_subsample_and_taskdata_errors() -> None:
    full = TaskData(torch.arange(10.0), torch.arange(10), torch.zeros(4), torch.zeros(4))
    part = data.subsample(full, train=4, test=2, seed=1)
    assert len(part.x_train) == 4 and len(part.x_test) == 2
    assert torch.equal(part.x_train, part.y_train.float())  # rows stay paired
    for bad in (0, -1, True, 2.5):
        with pytest.raises(InvalidParameterError):
            data.subsample(full, train=bad, test=None, seed=0)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError):
        TaskData(torch.zeros(3), torch.zeros(2), torch.zeros(1), torch.zeros(1))


# ----------------------------------------------------------------------------- end to end


def _tiny_setting(dataset: str, optimizer: str, metric: str = "accuracy") -> Setting:
    return Setting(
        name=f"{dataset}_tiny",
        dataset=dataset,
        n=32,
        lot_size=4,
        noise_multiplier=1.0,
        epochs=3,  # the "paper's" epochs; the test profile runs fewer
        learning_rate=0.05,
        max_grad_norm=1.0,
        optimizer=optimizer,
        model=f"tiny {dataset} model",
        delta=1e-5,
        metric=metric,
        paper_metric=0.9 if metric == "accuracy" else 0.95,
        paper_mu_clt=0.5,
    )


CATALOGUE = (
    _tiny_setting("mnist", "sgd"),
    _tiny_setting("imdb", "adam"),
    _tiny_setting("adult", "sgd"),
    _tiny_setting("movielens", "adam", "rmse"),
)


def _tiny(n: int, x: torch.Tensor, classes: int, info: dict[str, int]) -> TaskData:
    generator = torch.Generator().manual_seed(n)
    y = torch.randint(0, classes, (len(x),), generator=generator)
    return TaskData(x[:n], y[:n], x[n:], y[n:], info)


LOADERS = {
    "mnist": lambda: _tiny(32, torch.rand(48, 1, 28, 28), 10, {}),
    "imdb": lambda: _tiny(32, torch.randint(0, 30, (48, 12)), 2, {"vocab_size": 30}),
    "adult": lambda: _tiny(32, torch.randn(48, 7), 2, {"in_features": 7}),
    "movielens": lambda: _tiny(
        32,
        torch.stack([torch.randint(0, 6, (48,)), torch.randint(0, 9, (48,))], 1),
        5,
        {"users": 6, "items": 9},
    ),
}
TINY = training.TrainingConfig(
    profile="quick", epochs={"mnist": 1, "imdb": 1, "adult": 1, "movielens": 1}
)


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    """A README with the table's markers in ``tmp_path``; figures go to ``tmp_path/figures``."""
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- training-table:start -->\nold\n<!-- training-table:end -->\nend\n")
    return tmp_path


def test_compute_and_plot_end_to_end(sandbox: Path) -> None:
    output = Output.under(sandbox)
    training.compute(config=TINY, loaders=LOADERS, catalogue=CATALOGUE, output=output)
    saved = output.load_results(training.STEM)
    rows, summary = saved["rows"], saved["summary"]
    assert len(rows) == 2 * 4  # one epoch per task, private and non-private
    q, sigma = 4 / 32, 1.0
    for setting in CATALOGUE:
        mine = [r for r in rows if r["setting"] == setting.name]
        for row in mine:  # Bu et al. Cor. 5: mu = q sqrt(T (e^{1/sigma^2} - 1)), T = 8 per epoch
            assert row["step"] == 8 * row["epoch"]
            assert row["mu"] == pytest.approx(q * math.sqrt(row["step"] * math.expm1(sigma**-2)))
            assert row["epsilon_rdp"] > 0 and row["epsilon_clt"] > 0
        item = summary[setting.name]
        run = item["privacy_run"]
        assert run["epsilon_pld_lower"] <= run["epsilon_pld_upper"] <= run["epsilon_rdp"] + 1e-9
        assert item["privacy_paper_epochs_ours"]["mu"] >= run["mu"]  # 3 paper epochs >= run
        statements = json.loads(
            output.path(f"bu2019_training_{setting.dataset}_privacy.json").read_text()
        )
        statement = statements[setting.name]
        assert statement["clt_mu"] == pytest.approx(mine[-1]["mu"])
        assert statement["epsilon"]["gdp_clt"]["kind"] != statement["epsilon"]["rdp"]["kind"]
        assert statement["run"]["privacy_unit"] == training.PRIVACY_UNITS[setting.dataset]
        baseline = [r for r in rows if r["task"] == setting.dataset and not r["private"]]
        assert len(baseline) == len(mine) and baseline[0]["mu"] is None
    rmse = [r["test_metric"] for r in rows if r["metric"] == "rmse"]
    assert all(0.0 <= v <= 4.0 for v in rmse)
    accuracy = [r["test_metric"] for r in rows if r["metric"] == "accuracy"]
    assert all(0.0 <= v <= 1.0 for v in accuracy)

    training_report.plot(output=output, readme=sandbox / "README.md")
    for suffix in ("accuracy", "vs_mu"):
        assert output.path(f"{training.STEM}_{suffix}.png").stat().st_size > 10_000
    readme = (sandbox / "README.md").read_text()
    assert "old" not in readme and readme.endswith("<!-- training-table:end -->\nend\n")
    assert "Profile **quick** (few epochs" in readme
    assert "| MNIST | mnist_tiny: 1, 4 (4), 0.05, 1, sgd | 1 (3) |" in readme
    assert "| MovieLens-100K |" in readme and "(0.893)" in readme  # Table 4 non-private RMSE
    # paper's schedule (3 epochs = 24 steps at q = 1/8, sigma 1): mu = 0.125 sqrt(24 (e - 1))
    mu = 0.125 * math.sqrt(24 * math.expm1(1.0))
    assert f"| {mu:.2f} (0.50) |" in readme


def test_quick_figure_draws_the_saved_full_curves_beside_its_own(
    sandbox: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.axes

    output = Output.under(sandbox)
    training.compute(config=TINY, loaders=LOADERS, catalogue=CATALOGUE, output=output)
    saved = output.load_results(training.STEM)
    output.save_results(
        training.results_stem("full"),
        config={**saved["config"], "profile": "full"},
        rows=saved["rows"],
        extra={k: v for k, v in saved.items() if k not in ("config", "rows")},
    )
    labels: list[str] = []
    original = matplotlib.axes.Axes.plot

    def recording(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        labels.append(str(kwargs.get("label")))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording)
    training_report.plot(output=output, readme=sandbox / "README.md")
    beside = [label for label in labels if label.endswith("(full profile, committed)")]
    # one dashed curve per setting in each of the two figures of the quick profile only
    assert sorted(beside) == sorted([f"{s.name} (full profile, committed)" for s in CATALOGUE] * 2)


def test_readme_left_alone_without_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    assert not write_between_markers(readme, "<!-- a -->", "<!-- b -->", "t")
    assert readme.read_text() == "no markers\n"
    assert not write_between_markers(tmp_path / "absent.md", "a", "b", "t")


class _KilledError(Exception):
    pass


def test_a_killed_run_resumes_to_the_uninterrupted_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = training.RunSpec(setting=CATALOGUE[2], epochs=3, seed=0)
    task = LOADERS["adult"]()
    reference, _ = training.execute(spec, task, None)
    store = tmp_path / "runs"
    evaluate, calls = training_runs.evaluate, {"n": 0}

    def killed_at_second_evaluation(*args: object, **kwargs: object) -> float:
        calls["n"] += 1
        if calls["n"] == 2:
            raise _KilledError
        return evaluate(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(training_runs, "evaluate", killed_at_second_evaluation)
    with pytest.raises(_KilledError):
        training.execute(spec, task, store)
    (folder,) = store.iterdir()
    saved = json.loads((folder / "state.json").read_text())
    assert len(saved["rows"]) == 1 and not saved["done"]
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint-8.pt", "state.json"]
    monkeypatch.setattr(training_runs, "evaluate", evaluate)
    resumed, trainer = training.execute(spec, task, store)
    assert resumed.done and trainer.steps_done == 24
    assert [r["test_metric"] for r in resumed.rows] == [r["test_metric"] for r in reference.rows]
    assert [r["mu"] for r in resumed.rows] == [r["mu"] for r in reference.rows]
    # finished: read back without training; another code fingerprint starts afresh
    again, _ = training.execute(spec, task, store)
    assert again.rows == resumed.rows
    fresh, _ = training.execute(spec, task, store, fingerprint="other", deadline=0.0)
    assert fresh.rows == [] and not fresh.done


def test_bad_inputs() -> None:
    with pytest.raises(InvalidParameterError):
        training.compute("medium")
    with pytest.raises(InvalidParameterError):
        training.selected_settings(dataclasses.replace(TINY, settings=("nope",)), CATALOGUE)
    with pytest.raises(InvalidParameterError):
        training.epochs_run(dataclasses.replace(TINY, epochs={"mnist": 0}), CATALOGUE[0])


def test_profiles_use_the_papers_settings() -> None:
    quick = training.selected_settings(training.PROFILES["quick"])
    assert [s.dataset for s in quick] == ["mnist", "imdb", "adult", "movielens"]
    full = training.selected_settings(training.PROFILES["full"])
    assert full == list(SETTINGS) and training.PROFILES["full"].checkpoint
    # the full profile runs the paper's epochs; quick runs fewer and says so in the table
    assert all(training.epochs_run(training.PROFILES["full"], s) == s.epochs for s in full)
    assert all(training.epochs_run(training.PROFILES["quick"], s) < s.epochs for s in quick)


# ----------------------------------------------------------------------------- fanned out


def _seeded_task(dataset: str) -> TaskData:
    """The tiny task of :data:`LOADERS`, the same on every call (in any thread or process)."""
    with torch_seeded(11):
        return LOADERS[dataset]()


SEEDED = {dataset: functools.partial(_seeded_task, dataset) for dataset in LOADERS}


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in rows]


def _never_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: object) -> None:
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(DPTrainer, "step", refuse)
    monkeypatch.setattr(NonPrivateTrainer, "step", refuse)


def test_runs_fanned_out_on_threads_give_the_in_process_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every setting and baseline trained at once on a thread pool, into the run store, gives the
    rows and summary of the runs trained here one after another; run again on the same store,
    nothing trains."""
    here, threads = Output.under(tmp_path / "here"), Output.under(tmp_path / "threads")
    training.compute(config=TINY, loaders=SEEDED, catalogue=CATALOGUE, output=here)
    assert not here.runs.exists()  # in process, the quick profile keeps no run store
    with ThreadPoolExecutor(2) as pool:
        training.compute(
            config=TINY, loaders=SEEDED, catalogue=CATALOGUE, output=threads, executor=pool
        )
    ours, theirs = here.load_results(training.STEM), threads.load_results(training.STEM)
    assert _untimed(ours["rows"]) == _untimed(theirs["rows"]) and len(ours["rows"]) == 8
    assert ours["summary"] == theirs["summary"]
    assert theirs["runs_spread"] == "fanned out on ThreadPoolExecutor"
    specs = training.run_specs(TINY, CATALOGUE)
    assert len(specs) == 8 and len(list(threads.store(training.STEM).iterdir())) == len(specs)
    _never_trains(monkeypatch)
    with ThreadPoolExecutor(2) as pool:
        training.compute(
            config=TINY, loaders=SEEDED, catalogue=CATALOGUE, output=threads, executor=pool
        )
    assert threads.load_results(training.STEM)["rows"] == theirs["rows"]


def test_runs_fanned_out_on_spawned_processes_give_the_in_process_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same in fresh interpreters (``--executor processes:2``), the runs' results coming back
    through the store; a rerun on that store trains nothing."""
    config = dataclasses.replace(TINY, settings=("adult_tiny", "movielens_tiny"))
    here, spawned = Output.under(tmp_path / "here"), Output.under(tmp_path / "spawned")
    training.compute(config=config, loaders=SEEDED, catalogue=CATALOGUE, output=here)
    training.compute(
        config=config, loaders=SEEDED, catalogue=CATALOGUE, output=spawned, executor="processes:2"
    )
    ours, theirs = here.load_results(training.STEM), spawned.load_results(training.STEM)
    assert _untimed(ours["rows"]) == _untimed(theirs["rows"]) and len(ours["rows"]) == 4
    assert ours["summary"] == theirs["summary"] and theirs["runs_spread"] == "2 runs at once"
    _never_trains(monkeypatch)  # here, where the workers' runs are read back from the store
    with ThreadPoolExecutor(1) as pool:
        training.compute(
            config=config, loaders=SEEDED, catalogue=CATALOGUE, output=spawned, executor=pool
        )
    assert spawned.load_results(training.STEM)["rows"] == theirs["rows"]


def test_a_bad_executor_is_refused_before_anything_runs(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    for executor in ("threads:2", object()):
        with pytest.raises(InvalidParameterError, match="executor"):
            training.compute(
                config=TINY, loaders=SEEDED, catalogue=CATALOGUE, output=output, executor=executor
            )
    assert not output.figures.exists() and not output.runs.exists()
