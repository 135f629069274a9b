"""The largest *logical* lot trained under the memory cap with a fixed physical batch (CPU).

Large lots make DP-SGD accurate; with virtual lots (:class:`dpcore.torch.loaders.LotLoader` +
:func:`dpcore.torch.private.make_private`) a lot is loaded and clipped ``PHYSICAL`` examples at a
time, so memory should follow the physical batch, not the lot. Each worker (one process, one torch
thread, killed above the cap like :mod:`bench.training_memory`'s) trains the TF Privacy MNIST CNN
with the exact fast path on a synthetic map-style dataset whose examples are made on the fly from
their index (nothing of the lot is held in memory but its micro-batch): first two lots of
``BASELINE`` examples processed in one batch each (the one-batch path; the second is timed),
then one logical lot of L examples (q = 1 over a dataset of L records: every record, by Poisson
sampling with rate 1) in micro-batches of ``PHYSICAL``. It reports the peak RSS and the seconds
per example of both; their ratio is the cost of splitting (loading included in both).

``python -m bench.logical_lots --update`` runs this sweep alone and replaces its rows in an
existing ``bench/results/training_memory.json`` (the meta file records its own commit).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench import cells
from dpcore.runs import workers
from dpcore.runs.cells import Cell, worker_settings

PHYSICAL = 256
BASELINE = 16384
CELL = Cell("mnist_cnn", "dpsgd_exact_virtual")
MIN_LOG2, MAX_LOG2, QUICK_LOG2 = 14, 20, 14
TIMEOUT = 1200.0


def _dataset(size: int) -> Any:
    import torch
    from torch.utils.data import Dataset

    class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
        """A 28x28 image and a label per index, made when asked for (seeded by the index)."""

        def __len__(self) -> int:
            return size

        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            generator = torch.Generator().manual_seed(index)
            return torch.rand(1, 28, 28, generator=generator), index % 10

    return SyntheticImages()


def _lots(model: Any, size: int, *, lots: int = 1, physical: int | None = PHYSICAL) -> list[float]:
    """Seconds of each of ``lots`` logical lots of ``size`` examples (q = 1), micro-batched by
    ``physical`` (None: one batch); the first lot of a new engine also runs its one-time checks."""
    import torch
    from torch import nn

    from dpcore.torch.loaders import LotLoader
    from dpcore.torch.private import make_private
    from dpcore.torch.samplers import PoissonSampler

    loader = LotLoader(
        _dataset(size),
        sampler=PoissonSampler(size, sampling_probability=1.0, seed=0),
        max_physical_batch_size=physical,
    )
    _, optimizer, loader = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        loader,
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        max_grad_norm=cells.MAX_GRAD_NORM,
        noise_multiplier=cells.NOISE_MULTIPLIER,
        engine="fast",
        seed=0,
    )
    seconds = []
    for _ in range(lots):
        start = time.perf_counter()
        steps = [result for micro in loader if (result := optimizer.step(micro)) is not None]
        seconds.append(time.perf_counter() - start)
        assert len(steps) == 1 and steps[0].lot_size == size
    return seconds


def measure(lot: int) -> dict[str, Any]:
    """Train the one-batch lot then the logical lot in this process; seconds and peak RSS."""
    with worker_settings(1):
        return _measure(lot)


def _measure(lot: int) -> dict[str, Any]:
    from dpcore.torch.models import tf_privacy_mnist_cnn

    row: dict[str, Any] = {"error": None, "peak_rss_mb": None}
    try:
        model = tf_privacy_mnist_cnn()
        one_batch = _lots(model, BASELINE, lots=2, physical=None)[-1]
        row["one_batch_rss_mb"] = workers.peak_rss_mb()
        (logical,) = _lots(model, lot)
        row.update(
            step_seconds=logical,
            seconds_per_example=logical / lot,
            seconds_per_example_one_batch=one_batch / BASELINE,
            per_example_ratio=(logical / lot) / (one_batch / BASELINE),
            one_batch_lot=BASELINE,
        )
    except (Exception, MemoryError) as error:  # recorded: the parent decides what it means
        row["error"] = f"{type(error).__name__}: {error}"[:2000]
    row["peak_rss_mb"] = workers.peak_rss_mb()
    return row


def sweep(
    *, quick: bool, cap_mb: float, progress: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Logical lots ``2**MIN_LOG2 ..`` (quick: one) until the cap, an error or ``2**MAX_LOG2``."""
    rows: list[dict[str, Any]] = []
    largest: int | None = None
    stopped_by = "reached the largest lot tried"
    last = QUICK_LOG2 if quick else MAX_LOG2
    for k in range(MIN_LOG2, last + 1):
        lot = 2**k
        progress.set_postfix_str(f"virtual lot {lot}")
        measured = cells.run_capped(
            CELL, lot, cap_mb=cap_mb, timeout=TIMEOUT, module="bench.logical_lots"
        )
        row = {
            "model": CELL.model,
            "method": CELL.method,
            "jl_dimension": None,
            "batch_size": PHYSICAL,
            "logical_lot": lot,
            "physical_batch_size": PHYSICAL,
            **measured,
        }
        rows.append(row)
        progress.update(1)
        if row.get("exceeded_cap") or row.get("error") or row.get("skipped"):
            stopped_by = f"stopped at logical lot {lot}: " + (
                "exceeded the cap"
                if row.get("exceeded_cap")
                else str(row.get("error") or row.get("skipped"))
            )
            progress.write(stopped_by[:300])
            break
        largest = lot
        progress.write(
            f"virtual lot {lot}: {row['peak_rss_mb']:.0f} MiB, {row['step_seconds']:.1f} s, "
            f"{row['per_example_ratio']:.3f}x the one-batch time per example"
        )
    for row in rows:
        row["largest_logical_lot"] = largest
    summary = {
        "method": CELL.method,
        "physical_batch_size": PHYSICAL,
        "largest_logical_lot": largest,
        "stopped_by": stopped_by,
        "goal_1M_met": largest is not None and largest >= 1_000_000,
    }
    return rows, summary


def update(results_dir: Path) -> list[dict[str, Any]]:
    """Run the sweep alone; replace its rows and summary in ``training_memory.json`` (+ meta)."""
    from tqdm import tqdm

    from bench.training_memory import CAP_MB, ROOT
    from dpcore.provenance import provenance

    path = results_dir / "training_memory.json"
    meta_path = results_dir / "training_memory.meta.json"
    rows = [r for r in json.loads(path.read_text()) if r["method"] != CELL.method]
    meta = json.loads(meta_path.read_text())
    with tqdm(total=MAX_LOG2 - MIN_LOG2 + 1, desc="logical lots", unit="lot") as progress:
        logical_rows, summary = sweep(quick=False, cap_mb=CAP_MB, progress=progress)
    summary["provenance"] = provenance(root=ROOT, benchmark="logical_lots")
    meta["logical_lots"] = summary
    path.write_text(json.dumps(rows + logical_rows, indent=2) + "\n")
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return logical_rows


def _worker(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.logical_lots --worker")
    parser.add_argument("--worker", required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    workers.emit_result(measure(args.batch_size))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        update(Path(__file__).resolve().parent / "results")
        sys.exit(0)
    sys.exit(_worker(sys.argv[1:]))
