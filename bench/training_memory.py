"""The largest lot that fits in a memory cap, per DP training method (host RSS, CPU).

Goal (from the issue): "the largest lot that fits in 8 GiB within 2x of non-private for the fast
exact path and for JL" -- the DP-SGD-JL paper's Table 3 claim, on the TensorFlow Privacy MNIST
CNN (:func:`dpcore.torch.models.tf_privacy_mnist_cnn`).

Methods (the step builders of :mod:`bench.training`, with the lot size passed through):
``nonprivate``, ``dpsgd_exact`` (``FastEngine``), ``dpsgd_vmap`` (``VmapEngine``), ``dpsgd_jl``
with r = 10 (``JLEngine``) and ``opacus_hooks``.

For each method, lots ``2**k`` for k = 10, 11, ... run one at a time, each in a fresh process
(``python -m bench.training_memory --worker``) doing 1 warm-up step and 1 timed step on random
data of the right shape. The parent polls the worker's resident set (``VmRSS`` in
``/proc/<pid>/status``) every 50 ms and kills it (SIGKILL) as soon as it passes the cap (8192 MiB):
``RLIMIT_AS`` is not used, since torch reserves far more virtual memory than it touches. A lot
whose worker was killed, or whose own peak (``VmHWM``) ended above the cap (a spike between two
polls), is ``exceeded_cap: true`` with ``peak_rss_mb: null``; otherwise ``peak_rss_mb`` is the
worker's ``VmHWM`` after both steps (it includes the interpreter, torch and the data, ~0.3 GiB
at small lots) and ``polled_rss_mb`` the largest ``VmRSS`` the parent saw.

A method's sweep stops at the first lot that exceeds the cap, fails (an out-of-memory error or any
other), is too slow, or after ``2**17``. *Too slow*: a step over 60 s -- the worker skips the
timed step when its warm-up (first) step took over 180 s (a first step may run one-time checks),
and the parent does not start a lot whose step, predicted as twice the previous lot's, would take
longer; either way the row is ``"skipped": "too slow"``
and that method's ``largest_lot_under_cap`` is then only a lower bound (``stopped_by`` says
why each sweep ended). Workers use 1 torch thread, like :mod:`bench.training`.

Output: ``training_memory.json`` (one row per lot tried) and ``training_memory.meta.json``
(provenance, the cap, and one summary per method with ``largest_lot_under_cap`` and its ratio to
non-private's). ``quick`` stops every sweep at ``2**12`` (a smoke test, not the answer).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import logical_lots, training
from bench.training import Cell

ROOT = Path(__file__).resolve().parents[1]
MODEL = "mnist_cnn"
CAP_MB = 8192.0
POLL_SECONDS = 0.05
MIN_LOG2 = 10
MAX_LOG2 = 17
QUICK_MAX_LOG2 = 12
SLOW_SECONDS = 60.0
#: The warm-up (first) step may take longer: an engine's first lot runs one-time checks (dpcore's
#: fast path: a reference backward and an eval-mode pass comparing three examples' norms).
WARMUP_SECONDS = 3 * SLOW_SECONDS
WORKER_TIMEOUT = 400.0
JL_DIMENSION = 10
METHODS = (
    Cell(MODEL, "nonprivate"),
    Cell(MODEL, "dpsgd_exact"),
    Cell(MODEL, "dpsgd_vmap"),
    Cell(MODEL, "dpsgd_jl", jl_dimension=JL_DIMENSION),
    Cell(MODEL, "opacus_hooks"),
)
_RESULT = "BENCH-RESULT "
_OOM_MARKERS = ("can't allocate memory", "out of memory", "MemoryError", "std::bad_alloc")


# ----------------------------------------------------------------------------- worker side


def measure(
    cell: Cell,
    batch_size: int,
    *,
    threads: int = 1,
    build: Callable[[Cell, int, str], tuple[Any, Callable[[], None]]] | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """One warm-up step then one timed step of ``cell`` on a lot of ``batch_size``, here.

    ``build(cell, batch_size, device)``, when given, returns ``(model, step)`` in place of
    :mod:`bench.training`'s model, random lot and step (other studies reuse this measurement with
    their own models). With ``device="cuda"`` the model and lot live on the GPU and
    ``peak_gpu_mb`` is ``torch.cuda.max_memory_allocated`` (None on CPU).
    """
    import torch

    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    cuda = device == "cuda"
    row: dict[str, Any] = {
        "step_seconds": None,
        "warmup_seconds": None,
        "baseline_rss_mb": None,
        "peak_rss_mb": None,
        "peak_gpu_mb": None,
        "skipped": None,
        "error": None,
    }
    try:
        if build is None:
            model = training._model(cell).to(device)
            inputs, targets = training._lot(cell.model, device, batch_size)
            step = training._step_function(cell, model, inputs, targets, batch_size)
        else:
            model, step = build(cell, batch_size, device)
        row["baseline_rss_mb"] = training.peak_rss_mb()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize()
            row["warmup_seconds"] = time.perf_counter() - start
            if row["warmup_seconds"] > WARMUP_SECONDS:
                row["skipped"] = "too slow"
            else:
                start = time.perf_counter()
                step()
                if cuda:
                    torch.cuda.synchronize()
                row["step_seconds"] = time.perf_counter() - start
    except (Exception, MemoryError) as error:  # recorded: the parent decides what it means
        row["error"] = f"{type(error).__name__}: {error}"[:2000]
    row["peak_rss_mb"] = training.peak_rss_mb()
    if cuda:
        row["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return row


def _worker(
    argv: list[str],
    *,
    build: Callable[[Cell, int, str], tuple[Any, Callable[[], None]]] | None = None,
    module: str = "bench.training_memory",
) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {module} --worker")
    parser.add_argument("--worker", required=True, help="the cell, as JSON")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    row = measure(
        Cell(**json.loads(args.worker)),
        args.batch_size,
        threads=args.threads,
        build=build,
        device=args.device,
    )
    print(_RESULT + json.dumps(row), flush=True)
    return 0


# ----------------------------------------------------------------------------- driver side


def _vmrss_mb(pid: int) -> float | None:
    """``VmRSS`` of ``pid`` in MiB, or None once the process is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def run_capped(
    cell: Cell,
    batch_size: int,
    *,
    cap_mb: float = CAP_MB,
    threads: int = 1,
    timeout: float = WORKER_TIMEOUT,
    module: str = "bench.training_memory",
    device: str = "cpu",
) -> dict[str, Any]:
    """Run one worker, killing it if its RSS passes ``cap_mb`` or it outlives ``timeout``.

    ``module`` is the worker's module (one whose ``__main__`` calls :func:`_worker`, possibly
    with its own ``build``); ``device`` is passed on to it.
    """
    command = [
        sys.executable,
        "-m",
        module,
        "--worker",
        json.dumps(dataclasses.asdict(cell)),
        f"--batch-size={batch_size}",
        f"--threads={threads}",
        f"--device={device}",
    ]
    polled = 0.0
    killed: str | None = None
    with tempfile.TemporaryFile("w+") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        started = time.perf_counter()
        try:
            while process.poll() is None:
                rss = _vmrss_mb(process.pid)
                if rss is not None:
                    polled = max(polled, rss)
                    if rss > cap_mb:
                        killed = "cap"
                        break
                if time.perf_counter() - started > timeout:
                    killed = "timeout"
                    break
                time.sleep(POLL_SECONDS)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
        out.seek(0)
        text = out.read()
    row: dict[str, Any] = {"polled_rss_mb": polled, "exceeded_cap": False}
    if killed == "cap":
        return {**row, "exceeded_cap": True, "peak_rss_mb": None, "step_seconds": None}
    if killed == "timeout":
        return {**row, "skipped": "too slow", "error": f"killed after {timeout:.0f} s"}
    for line in reversed(text.splitlines()):
        if line.startswith(_RESULT):
            row.update(json.loads(line.removeprefix(_RESULT)))
            if row["peak_rss_mb"] is not None and row["peak_rss_mb"] > cap_mb:
                row["exceeded_cap"] = True  # a spike between two polls
                row["peak_rss_mb"] = None
            return row
    # No result: killed by the kernel (OOM killer) or crashed.
    tail = text.strip()[-1500:]
    return {**row, "error": f"worker exited with status {process.returncode}: {tail}"}


def _is_oom(row: dict[str, Any]) -> bool:
    error = row.get("error") or ""
    return any(marker in error for marker in _OOM_MARKERS) or "status -9" in error


def sweep(
    cell: Cell,
    *,
    max_log2: int,
    cap_mb: float,
    threads: int,
    progress: Any,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows for lots ``2**MIN_LOG2 .. 2**max_log2`` of ``cell``, and the method's summary."""
    rows: list[dict[str, Any]] = []
    largest: int | None = None
    stopped_by = f"reached the largest lot tried, 2**{max_log2}"
    previous: float | None = None
    done = 0
    for k in range(MIN_LOG2, max_log2 + 1):
        lot = 2**k
        progress.set_postfix_str(f"{cell.method} lot {lot}")
        base = {
            "model": cell.model,
            "method": cell.method,
            "jl_dimension": cell.jl_dimension,
            "batch_size": lot,
        }
        if previous is not None and 2 * previous > SLOW_SECONDS:
            predicted = 2 * previous
            rows.append(
                {
                    **base,
                    "peak_rss_mb": None,
                    "exceeded_cap": False,
                    "step_seconds": None,
                    "skipped": "too slow",
                    "predicted_step_seconds": predicted,
                }
            )
            stopped_by = f"too slow: predicted {predicted:.0f} s per step at lot {lot}"
            progress.write(f"{cell.label} lot {lot}: skipped, predicted {predicted:.0f} s/step")
            break
        measured = run_capped(cell, lot, cap_mb=cap_mb, threads=threads)
        row = {
            **base,
            "peak_rss_mb": None,
            "exceeded_cap": False,
            "step_seconds": None,
            "skipped": None,
            "error": None,
            **measured,
        }
        rows.append(row)
        progress.update(1)
        done += 1
        if row["exceeded_cap"]:
            stopped_by = f"exceeded the cap at lot {lot}"
            progress.write(f"{cell.label} lot {lot}: exceeded {cap_mb:.0f} MiB")
            break
        if row["error"] is not None and row.get("skipped") is None:
            stopped_by = ("out of memory" if _is_oom(row) else "error") + f" at lot {lot}"
            progress.write(f"{cell.label} lot {lot}: {row['error']}"[:300])
            break
        if row.get("skipped") is not None:
            stopped_by = f"too slow at lot {lot} (warm-up step over {WARMUP_SECONDS:.0f} s)"
            progress.write(f"{cell.label} lot {lot}: skipped, too slow")
            break
        largest = lot
        previous = row["step_seconds"]
        progress.write(
            f"{cell.label} lot {lot}: {row['peak_rss_mb']:.0f} MiB, {row['step_seconds']:.2f} s"
        )
    progress.update(max_log2 - MIN_LOG2 + 1 - done)  # the lots this sweep did not need
    summary = {
        "method": cell.method,
        "jl_dimension": cell.jl_dimension,
        "largest_lot_under_cap": largest,
        "stopped_by": stopped_by,
        "lower_bound_only": not (stopped_by.startswith(("exceeded", "out of memory"))),
    }
    return rows, summary


def run(
    results_dir: Path,
    *,
    quick: bool = False,
    cap_mb: float = CAP_MB,
    threads: int = 1,
) -> list[dict[str, Any]]:
    """Sweep every method, write ``training_memory.json`` (+ ``.meta.json``), return the rows."""
    import torch
    from tqdm import tqdm

    from dpcore.provenance import provenance

    max_log2 = QUICK_MAX_LOG2 if quick else MAX_LOG2
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    per_method = max_log2 - MIN_LOG2 + 1
    logical_count = 1 if quick else logical_lots.MAX_LOG2 - logical_lots.MIN_LOG2 + 1
    total = len(METHODS) * per_method + logical_count
    with tqdm(total=total, desc="training memory", unit="lot") as progress:
        for cell in METHODS:
            method_rows, summary = sweep(
                cell, max_log2=max_log2, cap_mb=cap_mb, threads=threads, progress=progress
            )
            rows.extend(method_rows)
            summaries.append(summary)
        logical_rows, logical = logical_lots.sweep(quick=quick, cap_mb=cap_mb, progress=progress)
        rows.extend(logical_rows)
    reference = next(s["largest_lot_under_cap"] for s in summaries if s["method"] == "nonprivate")
    for summary in summaries:
        lot = summary["largest_lot_under_cap"]
        summary["ratio_to_nonprivate"] = None if not lot or not reference else lot / reference
        summary["within_2x_of_nonprivate"] = (
            None
            if summary["ratio_to_nonprivate"] is None
            else summary["ratio_to_nonprivate"] >= 0.5
        )
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "training_memory.json").write_text(json.dumps(rows, indent=2) + "\n")
    meta = provenance(
        root=ROOT,
        benchmark="training_memory",
        torch=torch.__version__,
        opacus=training._opacus_version(),
        model=MODEL,
        cap_mb=cap_mb,
        threads=threads,
        quick=quick,
        date=datetime.date.today().isoformat(),
        wall_seconds=time.perf_counter() - started,
        summaries=summaries,
        logical_lots=logical,
        config={
            "lots": [2**k for k in range(MIN_LOG2, max_log2 + 1)],
            "warmup_steps": 1,
            "timed_steps": 1,
            "poll_seconds": POLL_SECONDS,
            "slow_step_seconds": SLOW_SECONDS,
            "slow_warmup_seconds": WARMUP_SECONDS,
            "noise_multiplier": training.NOISE_MULTIPLIER,
            "max_grad_norm": training.MAX_GRAD_NORM,
            "jl_dimension": JL_DIMENSION,
        },
        notes=[
            "Memory is host RSS on CPU: the parent polls VmRSS every 50 ms and kills a worker "
            "above the cap; peak_rss_mb is the worker's VmHWM (includes ~0.3 GiB of "
            "interpreter, torch and data at small lots).",
            "largest_lot_under_cap is a power of two; with lower_bound_only the sweep ended for "
            "time (or the largest lot tried), not memory.",
            "dpsgd_exact_virtual rows (bench.logical_lots): one logical lot of logical_lot "
            "examples in micro-batches of physical_batch_size, from a dataset that makes each "
            "example on the fly; largest_logical_lot is the largest that stayed under the cap.",
        ],
    )
    (results_dir / "training_memory.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
