"""The models benchmark (``python -m bench models``): its quick profile writes the JSON and the
table made from it, a peer that fails is a recorded result, and exactness is checked in the run."""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import models, models_peers, models_table, models_zoo
from dpcore.errors import InvalidParameterError
from dpcore.torch.engines import ENGINE_NAMES


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("models")
    rows = models.run(folder, quick=True)
    return folder, rows


def test_the_quick_profile_writes_every_field(
    quick: tuple[Path, list[dict[str, Any]]],
) -> None:
    folder, rows = quick
    document = json.loads((folder / "models.json").read_text())
    meta = document
    assert document["rows"] == rows
    assert [row["model"] for row in rows] == list(models.QUICK_MODELS)
    assert meta["config"]["repetitions"] == models.QUICK_REPETITIONS == 3
    assert meta["config"]["batch_size"] == 32 and meta["config"]["threads"] == 1
    assert meta["quick"] is True and meta["models_measured"] == len(rows)
    assert set(meta["hardware"]) == {"host", "cpu", "cpus", "ram_gib"}
    assert meta["commit"] and meta["versions"]["torch"] == torch.__version__
    for name in ("transformers", "peft", "opacus"):
        assert meta["versions"][name]
    for row in rows:
        assert row["status"] == "measured"
        assert set(row["methods"]) == set(models.METHODS)
        for method, entry in row["methods"].items():
            assert (entry["step_seconds"] is None) == (entry["error"] is not None), method
            if entry["error"] is not None:
                assert set(entry["error"]) >= {"stage", "type", "message"}
                assert "\n" not in entry["error"]["message"]
        assert row["methods"]["nonprivate"]["step_seconds"] > 0
        assert row["methods"]["nonprivate"]["ratio_to_nonprivate"] is None
        dpcore = row["methods"]["dpcore"]
        assert dpcore["engine"] in ENGINE_NAMES and dpcore["ratio_to_nonprivate"] > 0
        assert set(row["dpcore_over"]) == {"opacus_hooks", "opacus_ghost"}
        checks = row["exactness"]
        assert checks["lot"] == models.EXACTNESS_LOT and checks["dtype"] == "float64"
        assert checks["dpcore"]["exact"] is True
        assert checks["dpcore"]["max_abs_diff"] <= models.TOLERANCE
        assert "error" in checks["opacus_hooks"] or "exact" in checks["opacus_hooks"]
        assert isinstance(row["findings"], list)
        assert row["dpcore_ratio"] == dpcore["ratio_to_nonprivate"]
        noise = row["noise"]
        assert noise["values"] == row["trainable_parameters"] and noise["seconds"] > 0
        assert noise["over_nonprivate_step"] == pytest.approx(
            noise["seconds"] / row["nonprivate_step_seconds"]
        )
        assert row["noise_over_nonprivate_step"] == noise["over_nonprivate_step"]
        assert row["nonprivate_step_seconds"] == row["methods"]["nonprivate"]["step_seconds"]
        assert row["dpcore_exact"] is True and row["engine"] == dpcore["engine"]
        for method, entry in row["methods"].items():
            error = entry["error"]
            assert row[f"{method}_error"] == (None if error is None else error["type"])


def test_the_encoder_row_records_what_opacus_fix_does(
    quick: tuple[Path, list[dict[str, Any]]],
) -> None:
    (row,) = [row for row in quick[1] if row["model"] == "transformer_encoder"]
    fix = row["exactness"]["opacus_fix"]
    assert "MultiheadAttention" in fix["replaced"]
    assert fix["replaced_by"] == ["DPMultiheadAttention"]
    assert fix["max_abs_output_difference"] > 1e-3
    assert any("ModuleValidator.fix" in finding for finding in row["findings"])


def test_the_table_is_made_from_the_json(quick: tuple[Path, list[dict[str, Any]]]) -> None:
    folder, rows = quick
    document = json.loads((folder / "models.json").read_text())
    table = (folder / "models.md").read_text()
    assert table == models_table.markdown(document)
    lines = table.splitlines()
    header = lines.index("| " + " | ".join(models_table.COLUMNS) + " |")
    body = lines[header + 2 : header + 2 + len(rows)]
    for row, line in zip(rows, body, strict=True):
        assert f"(`{row['model']}`)" in line
        assert line.count(" | ") == len(models_table.COLUMNS) - 1
        ratio = row["methods"]["dpcore"]["ratio_to_nonprivate"]
        assert f"| {ratio:.2f} |" in line
    for row in rows:
        for entry in row["methods"].values():
            if entry["error"] is not None:
                assert entry["error"]["type"] in table
    assert document["commit"] in table


def _failing_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opacus' hooks refuse the model when built; its ghost clipping fails on its first step;
    its per-example gradients raise."""

    def opacus_step(mode: str, *args: Any, **options: Any) -> Callable[[], None]:
        if mode == "hooks":
            raise RuntimeError("the peer refused\nsecond line")

        def broken() -> None:
            raise ValueError("the peer broke mid-step")

        return broken

    def opacus_gradients(*_: Any) -> None:
        raise KeyError("no hooks")

    monkeypatch.setattr(models_peers, "opacus_step", opacus_step)
    monkeypatch.setattr(models_peers, "opacus_gradients", opacus_gradients)


def test_a_peer_that_fails_is_recorded_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    _failing_peers(monkeypatch)
    row = models.measure(models.ModelRun("transformer_encoder", repetitions=2, warmup=1))
    methods = row["methods"]
    assert methods["opacus_hooks"]["error"] == {
        "stage": "build",
        "type": "RuntimeError",
        "message": "the peer refused",
    }
    assert methods["opacus_ghost"]["error"] == {
        "stage": "step",
        "type": "ValueError",
        "message": "the peer broke mid-step",
    }
    for method in ("opacus_hooks", "opacus_ghost"):
        assert methods[method]["step_seconds"] is None
        assert methods[method]["ratio_to_nonprivate"] is None
        assert row["dpcore_over"][method] is None
    assert methods["dpcore"]["ratio_to_nonprivate"] > 0
    assert row["exactness"]["opacus_hooks"]["error"]["type"] == "KeyError"
    assert row["exactness"]["dpcore"]["exact"] is True
    table = models_table.markdown(
        {"config": _config(), "commit": "abc", "date": "today", "rows": [row]}
    )
    assert "RuntimeError: the peer refused" in table and "second line" not in table
    assert "fails [" in table and "refused [" in table


def _config() -> dict[str, Any]:
    return {
        "batch_size": 32,
        "dtype": "float32",
        "threads": 1,
        "repetitions": 2,
        "exactness_dtype": "float64",
        "exactness_lot": 5,
        "tolerance": 1e-9,
    }


def test_a_model_whose_library_is_missing_has_a_row_without_numbers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    absent = models_zoo.ModelRecipe(
        "absent",
        "no_such_library_here",
        "Absent",
        models_zoo.transformer_encoder,
        models_zoo.token_lot,
    )
    monkeypatch.setitem(models_zoo.MODELS, "absent", absent)
    rows = models.run(tmp_path, models=("absent",))
    assert rows[0]["status"] == "not installed: no_such_library_here"
    assert "methods" not in rows[0]
    table = (tmp_path / "models.md").read_text()
    assert "| Absent (`absent`) | not installed: no_such_library_here |" in table


def test_interleaved_timing_rotates_the_order_and_ratios_are_per_repetition() -> None:
    calls: list[str] = []
    steps: dict[str, Callable[[], None]] = {
        name: functools.partial(calls.append, name) for name in "abc"
    }
    seconds, errors = models.time_interleaved(steps, repetitions=3, warmup=1)
    assert errors == {} and all(len(times) == 3 for times in seconds.values())
    assert calls[3:] == list("abcbcacab")
    numerator, denominator = [2.0, 9.0, 3.0], [1.0, 3.0, 1.0]
    assert models.median_ratio(numerator, denominator) == statistics.median([2.0, 3.0, 3.0])
    assert models.median_ratio([], denominator) is None


def test_unknown_models_and_bad_threads_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="model"):
        models.run(tmp_path, models=("resnet9000",))
    with pytest.raises(InvalidParameterError, match="threads"):
        models.run(tmp_path, models=("bert",), threads=0)
    assert not (tmp_path / "models.json").exists()


def test_findings_name_inexact_gradients_a_changing_fix_and_a_fallback() -> None:
    exact = {"exact": True, "max_abs_diff": 0.0}
    row: dict[str, Any] = {
        "methods": {"dpcore": {"engine": "fast"}},
        "exactness": {"lot": 5, "dpcore": exact, "opacus_hooks": exact, "opacus_fix": {}},
    }
    assert models.findings(row) == []
    row["exactness"]["opacus_hooks"] = {
        "exact": False,
        "max_abs_diff": 1e-16,
        "missing": [],
        "wrong_shape": ["pos.weight [1, 8] for [5, 8]"],
    }
    row["exactness"]["dpcore"] = {"exact": False, "max_abs_diff": 0.25, "worst_parameters": ["w"]}
    row["exactness"]["opacus_fix"] = {
        "replaced": ["MultiheadAttention"],
        "replaced_by": ["DPMultiheadAttention"],
        "max_abs_output_difference": 0.5,
    }
    row["methods"]["dpcore"]["engine"] = "vmap"
    dpcore, hooks, fix, fallback = models.findings(row)
    assert dpcore.startswith("dpcore: ") and "0.25 (most in w)" in dpcore
    assert "Opacus hooks: per-example gradients are not per example" in hooks
    assert "pos.weight [1, 8] for [5, 8]" in hooks
    assert "DPMultiheadAttention" in fix and "0.5" in fix
    assert fallback == "engine='auto' picked vmap"


def test_models_fanned_out_through_an_executor_are_measured_one_at_a_time(
    tmp_path: Path,
) -> None:
    """``run(executor=...)`` (``python -m bench models --executor ...``) hands each model to
    :func:`dpcore.runs.run_many`, one at a time, and saves the rows it gets back."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        rows = models.run(tmp_path, quick=True, models=("transformer_encoder",), executor=pool)
    document = json.loads((tmp_path / "models.json").read_text())
    assert document["rows"] == rows and rows[0]["status"] == "measured"
    assert rows[0]["methods"]["dpcore"]["ratio_to_nonprivate"] > 0
    assert (tmp_path / "models.md").exists()


def test_each_model_can_be_measured_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """``fresh_process=True`` (the full profile of ``python -m bench models``) measures each
    row in a spawned interpreter; the row is the same kind of result, and the config says so."""
    rows = models.run(tmp_path, quick=True, models=("transformer_encoder",), fresh_process=True)
    document = json.loads((tmp_path / "models.json").read_text())
    assert document["rows"] == rows and rows[0]["status"] == "measured"
    assert rows[0]["exactness"]["dpcore"]["exact"] is True
    assert document["config"]["fresh_process_per_model"] is True
    models.run(tmp_path, quick=True, models=("transformer_encoder",))
    document = json.loads((tmp_path / "models.json").read_text())
    assert document["config"]["fresh_process_per_model"] is False


def test_recipes_build_their_models_and_lots_at_the_sizes_given() -> None:
    """The tests build the benchmark's recipes smaller (tests/torch/library_models.py)."""
    sizes = models_zoo.Sizes(vocabulary=10, sequence_length=5, width=8, heads=2, feed_forward=6)
    encoder = models_zoo.recipe("transformer_encoder")
    model = encoder.model(dtype=torch.float64, sizes=sizes)
    assert model.embedding.weight.shape == (10, 8) and model.embedding.weight.dtype == torch.float64
    tokens, labels = encoder.make_lot(4, 0, sizes=sizes)
    assert tokens.shape == (4, 5) and int(tokens.max()) < 10 and labels.shape == (4,)
    assert model(tokens).shape == (4, sizes.classes)
    images, _ = models_zoo.image_lot(3, 0, models_zoo.Sizes(image_size=12))
    assert images.shape == (3, 3, 12, 12)
    inputs, _ = models_zoo.classifier_lot(5, 0, sizes)
    assert inputs["attention_mask"].shape == (5, 5)
    assert inputs["attention_mask"].sum(1).tolist() == [5, 4, 3, 2, 5]
    assert models_zoo.SIZES["width"] == models_zoo.DEFAULT_SIZES.width == 64
    assert models_zoo.SIZES["dropout"] == 0.0
    timm_rows = [name for name, spec in models_zoo.MODELS.items() if spec.library == "timm"]
    assert len(timm_rows) == 7  # built and checked in the bench environment (nox -s bench)


def test_the_full_profile_measures_the_wide_models_again_at_the_wide_sizes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    measured: list[models.ModelRun] = []

    def stub(run: models.ModelRun) -> dict[str, Any]:
        measured.append(run)
        return {"model": run.model, "title": run.model, "sizes": run.sizes, "status": "stub"}

    monkeypatch.setattr(models, "measure", stub)
    rows = models.run(tmp_path)
    default = [run.model for run in measured if run.sizes == "default"]
    wide = [run for run in measured if run.sizes == "wide"]
    assert default == list(models_zoo.MODELS)
    assert [run.model for run in wide] == list(models.WIDE_MODELS)
    assert all(run.repetitions == models.WIDE_REPETITIONS for run in wide)
    assert [row["sizes"] for row in rows] == [run.sizes for run in measured]
    document = json.loads((tmp_path / "models.json").read_text())
    assert document["config"]["wide_sizes"]["width"] == models.WIDE_SIZES.width == 512
    assert "Rows marked **wide**: width 512" in (tmp_path / "models.md").read_text()
    measured.clear()
    models.run(tmp_path, quick=True)
    assert {run.sizes for run in measured} == {"default"}


def test_a_wide_row_is_built_and_checked_at_its_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    small = models_zoo.Sizes(vocabulary=20, sequence_length=6, width=16, heads=2, feed_forward=24)
    monkeypatch.setitem(models.SIZE_PROFILES, "wide", small)
    row = models.measure(models.ModelRun("transformer_encoder", 1, 0, 1, "wide"))
    default = models.measure(models.ModelRun("transformer_encoder", 1, 0, 1))
    assert row["sizes"] == "wide" and default["sizes"] == "default"
    assert row["trainable_parameters"] < default["trainable_parameters"]
    assert row["exactness"]["dpcore"]["exact"] is True
    with pytest.raises(InvalidParameterError, match="sizes"):
        models.measure(models.ModelRun("bert", 1, 0, 1, "huge"))


def test_the_committed_table_is_the_one_made_from_the_committed_json() -> None:
    results = Path(models.ROOT) / "bench" / "results"
    document = json.loads((results / "models.json").read_text(encoding="utf-8"))
    assert (results / "models.md").read_text(encoding="utf-8") == models_table.markdown(document)


def test_rows_added_to_a_saved_run_replace_their_own_and_keep_the_others(tmp_path: Path) -> None:
    """``python -m bench models --add-models NAME ...``: the named rows are measured and added
    to the saved file, which lists the addition; its table says when they were added."""
    with pytest.raises(InvalidParameterError, match="add"):
        models.run(tmp_path, quick=True, models=("gru",), add=True)  # nothing saved yet
    first = models.run(tmp_path, quick=True, models=("transformer_encoder",))
    added = models.run(tmp_path, quick=True, models=("gru",), add=True)
    document = json.loads((tmp_path / "models.json").read_text())
    assert [row["model"] for row in document["rows"]] == ["transformer_encoder", "gru"]
    assert document["rows"][0] == first[0] and "commit" not in first[0]
    assert document["rows"][1]["commit"] and document["rows"][1]["date"]
    assert document["rows"][1]["methods"] == added[0]["methods"]
    assert document["models_measured"] == 2
    assert [entry["models"] for entry in document["added"]] == [["gru"]]
    assert "Rows gru added later" in (tmp_path / "models.md").read_text()
    models.run(tmp_path, quick=True, models=("transformer_encoder",), add=True)
    document = json.loads((tmp_path / "models.json").read_text())
    assert [row["model"] for row in document["rows"]] == ["transformer_encoder", "gru"]
    assert document["rows"][0]["commit"] and len(document["added"]) == 2
    with pytest.raises(InvalidParameterError, match="configuration"):
        models.run(tmp_path, quick=True, models=("gru",), add=True, threads=2)
    with pytest.raises(InvalidParameterError, match="add"):
        models.run(tmp_path, quick=True, add=True)


def test_the_command_line_adds_models_to_the_models_benchmark_only() -> None:
    from bench.__main__ import main

    with pytest.raises(SystemExit):
        main(["training", "--add-models", "gru"])


def test_opacus_is_measured_after_a_fix_that_keeps_the_model(tmp_path: Path) -> None:
    """Opacus refuses nn.GRU and ModuleValidator.fix swaps in its DPGRU with the same outputs:
    Opacus is timed and checked on the fixed model, the refusal kept beside the numbers."""
    (row,) = models.run(tmp_path, quick=True, models=("gru",))
    for method in ("opacus_hooks", "opacus_ghost"):
        entry = row["methods"][method]
        assert entry["after_fix"]["type"] == "UnsupportedModuleError"
        assert entry["error"] is not None or entry["ratio_to_nonprivate"] > 0
    assert row["methods"]["opacus_hooks"]["error"] is None
    hooks = row["exactness"]["opacus_hooks"]
    assert hooks["after_fix"] is True and "max_abs_diff" in hooks
    assert "measured after ModuleValidator.fix" in (tmp_path / "models.md").read_text()
    encoder = models_zoo.recipe("transformer_encoder")
    inputs, _ = encoder.make_lot(4, 0)
    assert models_peers.exactly_fixed(encoder.model(), inputs) is None  # its fix changes it


def test_a_model_at_the_wide_sizes_is_named_with_a_suffix(tmp_path: Path) -> None:
    """``--add-models gru:wide`` measures the GRU at the realistic width, with the wide rows'
    repetitions; unknown models and sizes are refused by name."""
    assert models.model_run("gru", 12, 1) == models.ModelRun("gru", 12, models.WARMUP, 1)
    assert models.model_run("gru:default", 12, 1).sizes == "default"
    wide = models.model_run("gru:wide", 12, 1)
    assert (wide.model, wide.sizes, wide.repetitions) == ("gru", "wide", models.WIDE_REPETITIONS)
    with pytest.raises(InvalidParameterError, match="sizes"):
        models.model_run("gru:huge", 12, 1)
    with pytest.raises(InvalidParameterError):
        models.model_run("resnet9000:wide", 12, 1)
    with pytest.raises(InvalidParameterError, match="sizes"):
        models.run(tmp_path, quick=True, models=("transformer_encoder:huge",))
