"""dpcore.runs.cells: a study's own worker module, in its own folder, timed through the shared
cells (its ``build`` hook, its module and working folder passed in; nothing of bench/)."""

from __future__ import annotations

from pathlib import Path

from dpcore.runs.cells import Cell, run_capped, run_timing

STUDY = """
import sys

from dpcore.runs.cells import memory_worker, timing_worker


def build(cell, device, batch_size=4):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, cell.jl_dimension or 1).to(device)
    inputs = torch.ones(batch_size, 3, device=device)

    def step():
        model(inputs).sum().backward()

    return model, step


def build_memory(cell, batch_size, device):
    return build(cell, device, batch_size)


if __name__ == "__main__":
    worker = timing_worker if "--warmup" in " ".join(sys.argv) else memory_worker
    hook = build if worker is timing_worker else build_memory
    sys.exit(worker(sys.argv[1:], build=hook, module="study"))
"""


def test_a_study_of_its_own_is_timed_and_sized_in_its_folder(tmp_path: Path) -> None:
    (tmp_path / "study.py").write_text(STUDY)
    cell = Cell("linear", "sum", jl_dimension=2)
    row = run_timing(
        cell, device="cpu", threads=1, warmup=1, steps=3, budget=None, timeout=120,
        module="study", cwd=tmp_path,
    )  # fmt: skip
    assert row["error"] is None, row["error"]
    assert row["parameters"] == 3 * 2 + 2 and row["timed_steps"] == 3
    assert len(row["step_seconds_all"]) == 3 and row["step_seconds"] > 0
    sized = run_capped(cell, 8, cap_mb=1e6, timeout=120, module="study", cwd=tmp_path)
    assert sized["error"] is None and sized["exceeded_cap"] is False
    assert sized["peak_rss_mb"] >= sized["baseline_rss_mb"] > 0
    elsewhere = run_timing(
        cell, device="cpu", threads=1, warmup=1, steps=3, budget=None, timeout=120,
        module="study", cwd=tmp_path.parent,
    )  # fmt: skip
    assert "No module named study" in elsewhere["error"]  # the folder is where it runs
