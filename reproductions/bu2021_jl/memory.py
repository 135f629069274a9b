"""Bu et al. 2021, Tables 3-4: the largest lot that fits in a memory cap, per training method.

Models: the TF Privacy MNIST CNN (:func:`dpcore.torch.models.tf_privacy_mnist_cnn`, 26,010
parameters; Table 3) and the same CNN with a dense hidden layer of :data:`WIDE_HIDDEN` = 32,768
units: 17,146,938 parameters, exactly the count of the paper's "17M" model of Table 4 (among the
ways of widening this CNN, only the dense layer at 2^15 units gives that count; the paper does
not print the architecture).

Methods, each one SGD step on a lot of random MNIST-shaped images (memory does not depend on the
values): non-private SGD, exact DP-SGD (dpcore's fast engine), DP-SGD-JL with r = 10 and r = 30.
dpcore's JL engine evaluates the r forward-mode projections in one vectorised pass by default
(r copies of the activations and of the parameter-sized directions); the rows marked
"one pass per direction" evaluate them one at a time (``vmap_directions=False``), the memory-lean
way.

Measurement is the memory benchmark's: its steps (:mod:`dpcore.runs.torch_cells`) under its cap
(:func:`dpcore.runs.cells.run_capped`). Each lot size runs in a fresh process (``python -m
reproductions.bu2021_jl.memory_worker --worker``: one warm-up and one timed step) whose resident
set the parent polls and kills above the cap (peak host RSS; on CUDA the cap applies to
``torch.cuda.max_memory_allocated`` instead). Lots are powers of two, searched by bisection on the
exponent (peak memory grows with the lot), so a method costs about log2(range) + 1 processes.

The full profile keeps each probe in its :class:`~reproductions.harness.Output`'s run store
(``reproductions/checkpoints/`` by default) so that a run cut off part-way resumes; each is keyed
by everything that determines it (:func:`probe_key`: the cell, the lot, the cap, threads,
timeout, noise multiplier, clipping norm, device, hardware, torch version and a fingerprint of
the measuring code), and one stored under another key is ignored.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpcore.runs import cells, one_at_a_time, run_many, torch_cells
from dpcore.runs import measurements as cache
from dpcore.runs.cells import Cell
from dpcore.runs.workers import is_oom
from reproductions.bu2021_jl import config as paper
from reproductions.bu2021_jl.memory_worker import MODULE, SMALL_HIDDEN, WIDE_HIDDEN, _variant
from reproductions.common import code_fingerprint
from reproductions.harness import ROOT, Executor, Output, fanning_out

STEM = "bu2021_jl_memory"
TABLE = "memory-table"
#: The code that measures (model and step builders, memory probe, worker, the outcome of a
#: probe): its fingerprint is part of every cached probe's key.
MEASURING_CODE = (
    "dpcore.torch",
    "dpcore.runs.workers",
    "dpcore.runs.cells",
    "dpcore.runs.torch_cells",
    MODULE,
    "reproductions.bu2021_jl.memory",
)
#: Fields of :class:`MemoryConfig` that say which probes run, not what one measures (the
#: ``cuda_*`` values are in ``cap_mb`` and the ranges once :meth:`MemoryConfig.on` applied them).
_NOT_IN_PROBE_KEY = (
    "methods",
    "small_log2",
    "wide_log2",
    "cuda_cap_mb",
    "cuda_small_log2",
    "cuda_wide_log2",
)


@dataclasses.dataclass(frozen=True)
class Method:
    """One training method of the tables."""

    method: str  # nonprivate, dpsgd_exact or dpsgd_jl (dpcore.runs.torch_cells' names)
    r: int | None = None
    per_direction: bool = False

    @property
    def label(self) -> str:
        names = {"nonprivate": "non-private SGD", "dpsgd_exact": "DP-SGD, exact (fast engine)"}
        if self.method != "dpsgd_jl":
            return names[self.method]
        return f"DP-SGD-JL, r = {self.r}" + (
            ", one pass per direction" if self.per_direction else ""
        )


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    """One profile of Tables 3-4."""

    profile: str = "quick"
    #: Memory cap in MiB (host RSS on CPU, allocated GPU memory on CUDA).
    cap_mb: float = 1024.0
    #: Dense width of the wide CNN (Table 4's model).
    wide_hidden: int = WIDE_HIDDEN
    #: Exponent range (log2 of the lot) searched on the small and the wide CNN.
    small_log2: tuple[int, int] = (10, 13)
    wide_log2: tuple[int, int] = (2, 8)
    methods: tuple[Method, ...] = (
        Method("nonprivate"),
        Method("dpsgd_exact"),
        Method("dpsgd_jl", 10),
        Method("dpsgd_jl", 30),
    )
    threads: int = 1
    #: Seconds before a worker is killed (its lot is then "too slow", not "too big").
    timeout: float = 45.0
    #: On CUDA: the cap (16 GiB, the memory of the paper's P100) and the exponent ranges.
    cuda_cap_mb: float = 16384.0
    cuda_small_log2: tuple[int, int] = (10, 20)
    cuda_wide_log2: tuple[int, int] = (4, 15)

    def on(self, device: str) -> MemoryConfig:
        """This profile as run on ``device``: on CUDA the ``cuda_*`` cap and ranges apply.

        Example:
            >>> PROFILES["quick"].on("cuda").cap_mb, PROFILES["quick"].on("cpu").cap_mb
            (16384.0, 1024.0)
        """
        if device == "cpu":
            return self
        return dataclasses.replace(
            self,
            cap_mb=self.cuda_cap_mb,
            small_log2=self.cuda_small_log2,
            wide_log2=self.cuda_wide_log2,
        )


PROFILES = {
    "quick": MemoryConfig(),
    "full": MemoryConfig(
        profile="full",
        cap_mb=8192.0,
        small_log2=(10, 17),
        wide_log2=(4, 13),
        methods=(
            *MemoryConfig().methods,
            Method("dpsgd_jl", 10, per_direction=True),
            Method("dpsgd_jl", 30, per_direction=True),
        ),
        timeout=400.0,
    ),
}


def stem_for(device: str) -> str:
    """Results stem of a run on ``device`` (:func:`.config.device_stem`: CPU and GPU apart)."""
    return paper.device_stem(STEM, device)


def table_for(device: str) -> str:
    """README marker of the table of a run on ``device``."""
    return paper.device_marker(TABLE, device)


def largest_fitting(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """Largest k in ``[low, high]`` with ``fits(k)``, for ``fits`` true up to a threshold.

    Bisection: ``1 + ceil(log2(high - low + 1))`` calls at most. None when ``fits(low)`` fails.

    Example:
        >>> calls = []
        >>> largest_fitting(lambda k: calls.append(k) or k <= 11, 8, 13), calls
        (11, [8, 11, 12])
    """
    if not fits(low):
        return None
    lo, hi = low, high  # fits(lo) holds; the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


# ----------------------------------------------------------------------------- worker side


def outcome(measured: dict[str, Any], cap_mb: float, device: str) -> str:
    """``fits``, ``exceeds`` (over the cap or out of memory), ``too_slow`` or ``error``."""
    if measured.get("exceeded_cap"):
        return "exceeds"
    error = measured.get("error")
    if error is not None and measured.get("skipped") == "too slow":
        return "too_slow"  # killed by the parent's timeout
    if error is not None:
        return "exceeds" if is_oom(measured) else "error"
    if device == "cuda" and (measured.get("peak_gpu_mb") or 0.0) > cap_mb:
        return "exceeds"
    return "fits"


def measuring_setup(device: str, hardware: str) -> dict[str, Any]:
    """What, besides the probe and the profile, determines a probe on this machine: ``device``,
    the hardware, the torch version and the measuring code's fingerprint
    (:data:`MEASURING_CODE`)."""
    import torch

    return {
        "device": device,
        "hardware": hardware,
        "torch": torch.__version__,
        "code": code_fingerprint(*MEASURING_CODE),
    }


def probe_key(
    config: MemoryConfig, setup: dict[str, Any], model: str, cell: Cell, lot: int
) -> dict[str, Any]:
    """The cache key of one probe: the model, the cell (method, dense width, r, one pass per
    direction), the lot, the profile as run on the device (cap, wide dense width, threads, timeout),
    the step's noise multiplier, clipping norm and learning rate, and ``setup``
    (:func:`measuring_setup`)."""
    fields = dataclasses.asdict(config)
    for name in _NOT_IN_PROBE_KEY:
        fields.pop(name)
    return {
        "study": STEM,
        "model": model,
        "cell": dataclasses.asdict(cell),
        "batch_size": lot,
        "config": fields,
        "noise_multiplier": torch_cells.NOISE_MULTIPLIER,
        "max_grad_norm": torch_cells.MAX_GRAD_NORM,
        "learning_rate": torch_cells.LEARNING_RATE,
        **setup,
    }


def run_probe(
    config: MemoryConfig,
    setup: dict[str, Any],
    model: str,
    hidden: int,
    method: Method,
    lot: int,
    *,
    output: Output,
) -> dict[str, Any]:
    """One lot of one method in a watched process, or its cached row.

    A row cached under exactly :func:`probe_key` is reused; the full profile caches every row
    it measures (atomically, in ``output``'s run store: ``<runs>/<STEM>/``).
    """
    device = setup["device"]
    cell = Cell("mnist_cnn", method.method, _variant(hidden, method.per_direction), method.r)
    key = probe_key(config, setup, model, cell, lot)
    stem = f"{model}_{method.method}_{method.r}_{int(method.per_direction)}_{lot}"
    path = cache.cached_path(output.store(STEM), stem, key)
    cached = cache.load(path, key)
    if cached is not None:
        return cached
    measured = cells.run_capped(
        cell,
        lot,
        # On CUDA the cap is judged on GPU memory; the host is only kept from swapping.
        cap_mb=config.cap_mb if device == "cpu" else 4 * config.cap_mb,
        threads=config.threads,
        timeout=config.timeout,
        module=MODULE,
        cwd=ROOT,
        device=device,
    )
    row = {
        "model": model,
        "method": method.method,
        "r": method.r,
        "per_direction": method.per_direction,
        "batch_size": lot,
        "outcome": outcome(measured, config.cap_mb, device),
        "peak_rss_mb": measured.get("peak_rss_mb"),
        "peak_gpu_mb": measured.get("peak_gpu_mb"),
        "step_seconds": measured.get("step_seconds"),
        "error": (measured.get("error") or "")[:300] or None,
    }
    if config.profile == "full":
        cache.store(path, key, row)
    return row


def parameter_count(hidden: int) -> int:
    """Parameters of the TF Privacy CNN with ``hidden`` dense units (26,010 at 32).

    Example:
        >>> parameter_count(SMALL_HIDDEN), parameter_count(WIDE_HIDDEN)
        (26010, 17146938)
    """
    from dpcore.torch.models import tf_privacy_mnist_cnn

    return sum(p.numel() for p in tf_privacy_mnist_cnn(hidden).parameters())


#: ``probe(model name, dense width, method, lot)``: the probe's row, or None when it was not run.
Prober = Callable[[str, int, Method, int], "dict[str, Any] | None"]


def sweep_method(
    config: MemoryConfig, device: str, name: str, method: Method, probe: Prober
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(row, probes)``: the bisection of one (model, method) of ``config``.

    A probe that returns None (not run) stops the bisection: the row is then marked
    ``complete: false`` and its lot is only a lower bound (or unknown).
    """
    hidden, (low, high) = {
        "small": (SMALL_HIDDEN, config.small_log2),
        "wide": (config.wide_hidden, config.wide_log2),
    }[name]
    mine: list[dict[str, Any]] = []
    missing: list[int] = []

    def fits(k: int) -> bool:
        if missing:
            return False  # stop at the first probe that was not run
        row = probe(name, hidden, method, 2**k)
        if row is None:
            missing.append(2**k)
            return False
        mine.append(row)
        return bool(row["outcome"] == "fits")

    k = largest_fitting(fits, low, high)
    above = [row for row in mine if row["batch_size"] > (2**k if k is not None else 0)]
    bounded_by_memory = bool(above) and all(row["outcome"] == "exceeds" for row in above)
    complete = not missing
    row = {
        "model": name,
        "parameters": parameter_count(hidden),
        "method": method.method,
        "r": method.r,
        "per_direction": method.per_direction,
        "label": method.label,
        "largest_lot": None if k is None else 2**k,
        "largest_tried": 2**high,
        "smallest_tried": 2**low,
        # True: the next lot up was tried and exceeded the cap (the answer is exact).
        "bounded_by_memory": complete and (bounded_by_memory or k is None),
        "complete": complete,
        "ratio_to_nonprivate": None,
        "peak_mb_at_largest": next(
            (
                row["peak_gpu_mb" if device == "cuda" else "peak_rss_mb"]
                for row in mine
                if k is not None and row["batch_size"] == 2**k
            ),
            None,
        ),
        "outcomes": ", ".join(
            [f"{row['batch_size']}: {row['outcome']}" for row in mine]
            + [f"{lot}: not run" for lot in missing]
        ),
    }
    return row, mine


def with_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's largest lot over its model's non-private one (``ratio_to_nonprivate``)."""
    for row in rows:
        reference = next(
            r["largest_lot"]
            for r in rows
            if r["model"] == row["model"] and r["method"] == "nonprivate"
        )
        if reference and row["largest_lot"]:
            row["ratio_to_nonprivate"] = row["largest_lot"] / reference


def sweeps(config: MemoryConfig) -> list[tuple[str, Method]]:
    """Every (model, method) of ``config``: the small CNN's methods, then the wide one's."""
    return [(name, method) for name in ("small", "wide") for method in config.methods]


def sweep(
    config: MemoryConfig, device: str, probe: Prober
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(rows, probes)``: :func:`sweep_method` for every (model, method) of ``config``, here."""
    from tqdm import tqdm

    probes: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for name, method in tqdm(sweeps(config), desc="largest lot under the cap", unit="method"):
        row, mine = sweep_method(config, device, name, method, probe)
        rows.append(row)
        probes += mine
    with_ratios(rows)
    return rows, probes


def hardware_of(config: MemoryConfig, device: str) -> str:
    """What measures here: the GPU's name on CUDA, else the CPU and the profile's threads."""
    import torch

    if device == "cuda":
        return f"{torch.cuda.get_device_name(0)} (CUDA)"
    return f"CPU, {config.threads} torch thread(s)"


@dataclasses.dataclass(frozen=True)
class MethodSweep:
    """One (model, method) bisection, a picklable spec for :func:`dpcore.runs.run_many`
    (:func:`sweep_job`): the profile as run on ``device``, and the run store's root
    (``Output.runs``) where the full profile keeps its probes."""

    config: MemoryConfig
    device: str
    model: str
    method: Method
    runs: str


def sweep_job(job: MethodSweep) -> dict[str, Any]:
    """:func:`sweep_method` of ``job`` on this machine, each probe in a watched worker process
    (:func:`run_probe`): its ``row``, its ``probes`` and the ``hardware`` that measured them."""
    hardware = hardware_of(job.config, job.device)
    setup = measuring_setup(job.device, hardware)
    output = Output(runs=Path(job.runs))
    row, probes = sweep_method(
        job.config,
        job.device,
        job.model,
        job.method,
        lambda name, hidden, method, lot: run_probe(
            job.config, setup, name, hidden, method, lot, output=output
        ),
    )
    return {"row": row, "probes": probes, "hardware": hardware}


def _save(
    config: MemoryConfig,
    device: str,
    rows: list[dict[str, Any]],
    probes: list[dict[str, Any]],
    *,
    hardware: str,
    torch_version: str,
    wall_time_s: float | None,
    output: Output,
) -> None:
    extra = {
        "seed": 0,
        "hardware": hardware,
        "device": device,
        "memory_measured": "torch.cuda.max_memory_allocated" if device == "cuda" else "peak RSS",
        "torch": torch_version,
        "wall_time_s": wall_time_s,
        "complete": all(row["complete"] for row in rows),
        "probes": probes,
    }
    output.save_results(stem_for(device), config=config, rows=rows, extra=extra)


def compute(
    profile: str = "quick",
    *,
    output: Output | None = None,
    executor: Executor = None,
) -> None:
    """Bisect the largest power-of-two lot under the cap for every (model, method).

    ``output`` (default :class:`~reproductions.harness.Output`) receives the results and keeps
    the full profile's probes in its run store. Each (model, method) bisection is a run of
    :func:`dpcore.runs.run_many` (:class:`MethodSweep`): here (``executor`` None or
    ``"local"``) or on ``executor``, handed one at a time (:func:`dpcore.runs.one_at_a_time`:
    the machine's memory and cores are the measurement's alone; the machine needs this
    checkout). The results name the hardware that measured them.

    Raises:
        InvalidParameterError: ``executor`` is invalid (before anything runs).
    """
    import torch
    from tqdm import tqdm

    fanning_out(executor)  # an invalid choice is refused before anything runs
    output = output or Output()
    device = paper.default_device()
    config = PROFILES[profile].on(device)
    start = time.perf_counter()
    jobs = [
        MethodSweep(config, device, name, method, str(output.runs))
        for name, method in sweeps(config)
    ]
    rows: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    machines: list[str] = []
    with one_at_a_time(executor) as chosen:
        for job in tqdm(jobs, desc="largest lot under the cap", unit="method"):
            (done,) = run_many(sweep_job, [job], executor=chosen, progress=False, retries=0)
            rows.append(done["row"])
            probes += done["probes"]
            machines += [done["hardware"]] if done["hardware"] not in machines else []
    with_ratios(rows)
    _save(
        config,
        device,
        rows,
        probes,
        hardware=" + ".join(machines),
        torch_version=torch.__version__,
        wall_time_s=round(time.perf_counter() - start, 1),
        output=output,
    )
