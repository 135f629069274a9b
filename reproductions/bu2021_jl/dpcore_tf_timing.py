"""Bu et al. 2021, Table 2 in TensorFlow: dpcore's TF DP-Adam (exact, JL) vs Keras 3 non-private.

The counterpart of :mod:`reproductions.bu2021_jl.tf_privacy_baseline` for dpcore's TensorFlow
backend (:mod:`dpcore.tf`, TensorFlow >= 2.16 with Keras 3): the same model (the tutorial's
bidirectional LSTM, 586,369 parameters), the same tokenised IMDb reviews and the same lots of
exactly 256 reviews (consecutive slices of one seeded permutation), Adam with learning rate 1e-3,
C = 1 and sigma = 1. Run it with ``nox -s dpcoretf`` (the ``tf`` extra); TensorFlow is imported
only in the worker processes. Methods, each one ``tf.function`` of Keras's ``train_step``:

- ``keras3_nonprivate``: ``keras.optimizers.Adam``, mean loss: this framework's own non-private
  reference (the TF Privacy file's ``keras_nonprivate`` is Keras 2 on TensorFlow 2.15);
- ``dpcore_tf_exact``: :class:`dpcore.tf.DPModel` with exact per-example clipping (``clipping``
  says which: ghost norms or per-example Jacobians);
- ``dpcore_tf_jl``: ``DPModel(..., jl_dimension=r)``, DP-Adam-JL (Bu et al. 2021, Alg. 2: norms
  from r forward-mode jvp projections), one row per r of ``jl_dimensions`` (the full profile:
  the paper's Table 2 dimensions 1, 5, 10, 30; the quick one: 1 and 5).

Each method runs in its own process. Warm-up lots (tracing) are not timed; ``seconds_per_step``
is the median timed lot and ``seconds_per_epoch`` that median times ``ceil(25,000 / 256) = 98``
(``extrapolated``), or the measured sum when a whole epoch was timed
(:func:`~reproductions.bu2021_jl.tf_privacy_baseline.summarize`). ``ratio_to_nonprivate``
divides by this file's ``keras3_nonprivate`` row (same framework, machine and run). A method
that fails (an error, killed for memory, stopped at the profile's ``timeout``) is a row with its
``error`` and no timing. :func:`reproductions.bu2021_jl.speed.dpcore_tf_rows` puts the rows
into Table 2. The full profile keeps each method's timed lots in the run store (keyed by the
setup, the TensorFlow and Keras versions and the measuring code), so a cut-off run resumes.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dpcore.errors import InvalidParameterError
from dpcore.runs import workers as protocol
from dpcore.runs.tf_cells import cpu_name
from reproductions.bu2021_jl import config as paper
from reproductions.bu2021_jl.dpcore_tf_worker import (
    DP_METHODS,
    METHODS,
    DpcoreTfConfig,
    method_key,
    worker,
)
from reproductions.bu2021_jl.tf_privacy_baseline import (
    _version,
    load_data,
    lots_per_epoch,
    run_module_worker,
    summarize,
)
from reproductions.bu2021_jl.tf_privacy_worker import _stored
from reproductions.common import code_fingerprint

if TYPE_CHECKING:
    from reproductions.harness.output import Output

__all__ = [
    "MODULE",
    "PROFILES",
    "STEM",
    "compute",
    "main",
    "method_row",
    "plan",
    "run_worker",
    "with_ratios",
]

STEM = "bu2021_jl_dpcore_tf"
MODULE = "reproductions.bu2021_jl.dpcore_tf_timing"
#: The code that measures: its fingerprint keys the full profile's checkpoints.
MEASURING_CODE = (
    "dpcore.tf",
    "dpcore.runs.tf_cells",
    "reproductions.bu2021_jl.dpcore_tf_worker",
    "reproductions.bu2021_jl.tf_privacy_worker",
)

PROFILES = {
    "quick": DpcoreTfConfig(),
    # non-private: one whole epoch timed; DP: 10 lots after 2 warm-up lots, every r of Table 2
    "full": DpcoreTfConfig(
        profile="full",
        jl_dimensions=paper.TABLE2_JL_DIMENSIONS,
        nonprivate_warmup=3,
        nonprivate_lots=98,
        dp_warmup=2,
        dp_lots=10,
    ),
}


def plan(config: DpcoreTfConfig) -> list[tuple[str, int | None]]:
    """``(method, r)`` in the order they are timed: the non-private reference first.

    Example:
        >>> plan(PROFILES["quick"])
        [('keras3_nonprivate', None), ('dpcore_tf_exact', None), ('dpcore_tf_jl', 1),
         ('dpcore_tf_jl', 5)]
    """
    return [
        ("keras3_nonprivate", None),
        ("dpcore_tf_exact", None),
        *(("dpcore_tf_jl", r) for r in config.jl_dimensions),
    ]


def method_row(
    method: str,
    r: int | None,
    step_seconds: Sequence[float] | None,
    lots: int,
    *,
    peak_rss_mb: float | None = None,
    clipping: str | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """The saved row of one method: :func:`.tf_privacy_baseline.summarize` of its timed lots
    (no timing when ``step_seconds`` is empty: a failed method) plus r, memory, clipping, error.

    Example:
        >>> row = method_row("dpcore_tf_jl", 5, [2.0, 1.0, 3.0], 98, clipping="jl")
        >>> row["seconds_per_step"], row["seconds_per_epoch"], row["r"], row["error"]
        (2.0, 196.0, 5, None)
        >>> method_row("dpcore_tf_exact", None, [], 98, error="MemoryError")["seconds_per_epoch"]
    """
    method_key(method, r)  # validates the pair
    if step_seconds:
        row = summarize(method, list(step_seconds), lots)
    else:
        row = {
            "method": method,
            "seconds_per_step": None,
            "seconds_per_epoch": None,
            "extrapolated": False,
            "timed_steps": 0,
            "lots_per_epoch": lots,
        }
    return {
        **row,
        "r": r,
        "ratio_to_nonprivate": None,
        "peak_rss_mb": peak_rss_mb,
        "clipping": clipping,
        "error": error,
    }


def with_ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with ``ratio_to_nonprivate``: seconds per epoch over the ``keras3_nonprivate``
    row's (None for a row without timing, or without that reference).

    Example:
        >>> rows = [method_row("keras3_nonprivate", None, [0.5], 98),
        ...         method_row("dpcore_tf_exact", None, [2.0], 98)]
        >>> [row["ratio_to_nonprivate"] for row in with_ratios(rows)]
        [1.0, 4.0]
    """
    reference = next(
        (
            row["seconds_per_epoch"]
            for row in rows
            if row["method"] == "keras3_nonprivate" and row["seconds_per_epoch"]
        ),
        None,
    )
    result = []
    for row in rows:
        seconds = row["seconds_per_epoch"]
        ratio = seconds / reference if seconds is not None and reference else None
        result.append({**row, "ratio_to_nonprivate": ratio})
    return result


def default_output() -> Output:
    """The default :class:`~reproductions.harness.output.Output` (figures/, the run store)."""
    from reproductions.harness.output import Output

    return Output()


def _checkpoint(config: DpcoreTfConfig, key: str, versions: dict[str, Any], output: Output) -> Path:
    """Where the full profile keeps one method's timed lots (``key``: :func:`.method_key`),
    keyed by all that sets a lot's time: the setup, ``versions`` (TensorFlow, Keras, the
    measuring code). The numbers of lots, the list of r and the timeout are left out, so a run
    asked for more lots or another r extends the last."""
    fields = {**dataclasses.asdict(config), **versions}
    for name in ("profile", "nonprivate_lots", "dp_lots", "jl_dimensions", "timeout"):
        fields.pop(name)
    digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
    return output.store(STEM) / f"{key}_{digest}.json"


def run_worker(
    method: str,
    config: DpcoreTfConfig,
    data_path: Path,
    checkpoint: Path | None,
    r: int | None = None,
) -> dict[str, Any]:
    """:func:`.dpcore_tf_worker.worker` in a child process (an empty heap per method; stopped
    after ``config.timeout`` seconds).

    Raises:
        RuntimeError: the child exited without a readable result line, or was stopped.
    """
    options = [] if r is None else ["--jl-dimension", str(r)]
    return run_module_worker(
        MODULE, method, config, data_path, checkpoint, options=options, timeout=config.timeout
    )


def _config(
    profile: str,
    config: DpcoreTfConfig | None,
    lots: int | None,
    threads: int | None,
    jl_dimensions: Sequence[int] | None,
) -> DpcoreTfConfig:
    if config is None:
        if profile not in PROFILES:
            raise InvalidParameterError("profile", f"one of {sorted(PROFILES)}", profile)
        config = PROFILES[profile]
    if lots is not None:
        if isinstance(lots, bool) or not isinstance(lots, int) or lots < 1:
            raise InvalidParameterError("lots", "an integer >= 1", lots)
        config = dataclasses.replace(config, dp_lots=lots)
    if jl_dimensions is not None:
        if any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in jl_dimensions):
            raise InvalidParameterError("jl_dimensions", "integers >= 1", list(jl_dimensions))
        config = dataclasses.replace(config, jl_dimensions=tuple(jl_dimensions))
    used = (config.threads if threads is None else threads) or os.cpu_count() or 1
    return dataclasses.replace(config, threads=used)


def compute(
    profile: str = "quick",
    *,
    config: DpcoreTfConfig | None = None,
    lots: int | None = None,
    threads: int | None = None,
    jl_dimensions: Sequence[int] | None = None,
    output: Output | None = None,
) -> Path:
    """Time every method and save ``bu2021_jl_dpcore_tf.{json,csv}``; returns the JSON.

    ``config`` replaces the profile's; ``lots`` overrides its timed lots per DP method,
    ``threads`` its TensorFlow threads (0: every core), ``jl_dimensions`` its r. The file is
    rewritten after each method. The full profile resumes from its checkpoints in ``output``'s
    run store. ``output`` (default :func:`default_output`: figures/) receives the files.
    """
    config = _config(profile, config, lots, threads, jl_dimensions)
    output = output or default_output()
    start = time.perf_counter()
    per_epoch = lots_per_epoch(config.dataset_size, config.lot_size)
    versions = {
        "tensorflow": _version("tensorflow") or _version("tensorflow-cpu"),
        "keras": _version("keras"),
        "code_fingerprint": code_fingerprint(*MEASURING_CODE),
    }
    extra: dict[str, Any] = {
        "seed": config.seed,
        "hardware": f"CPU {cpu_name()}, {config.threads} TensorFlow thread(s) of "
        f"{os.cpu_count()} cores",
        **versions,
        "errors": {},
        "paper_seconds_per_epoch": {
            "keras3_nonprivate": paper.PAPER_SECONDS_PER_EPOCH["nonprivate"],
            "dpcore_tf_exact": paper.PAPER_SECONDS_PER_EPOCH["tf_privacy_vanilla"],
            **{
                method_key("dpcore_tf_jl", r): paper.PAPER_SECONDS_PER_EPOCH.get(f"jl_{r}")
                for r in config.jl_dimensions
            },
        },
        "paper_hardware": paper.PAPER_HARDWARE,
    }
    rows: list[dict[str, Any]] = []

    def save() -> Path:
        extra["wall_time_s"] = round(time.perf_counter() - start, 1)
        return output.save_results(STEM, config=config, rows=with_ratios(rows), extra=extra)

    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "imdb_train.npz"
        x, y = load_data(config)
        np.savez(data, x=x, y=y)
        for method, r in plan(config):
            key = method_key(method, r)
            wanted = config.dp_lots if method in DP_METHODS else config.nonprivate_lots
            checkpoint = (
                _checkpoint(config, key, versions, output) if config.profile == "full" else None
            )
            try:
                result = run_worker(method, config, data, checkpoint, r)
            except Exception as error:  # a failed method is a row with its error, not fatal
                result = {"error": f"{type(error).__name__}: {error}"[:2000]}
            if "environment" in result:
                extra.update(result["environment"], parameters=result["parameters"])
            row = method_row(
                method,
                r,
                (result.get("step_seconds") or _stored(checkpoint))[:wanted],
                per_epoch,
                peak_rss_mb=result.get("peak_rss_mb"),
                clipping=result.get("clipping"),
                error=result.get("error"),
            )
            rows.append(row)
            if row["error"] is not None:
                extra["errors"][key] = row["error"]
                print(f"{key} failed: {row['error']}")
                save()
                continue
            how = "extrapolated from" if row["extrapolated"] else "measured over"
            print(
                f"{key}: {row['seconds_per_step']:.3f} s per lot, "
                f"{row['seconds_per_epoch']:,.1f} s per epoch ({how} {row['timed_steps']} lots)"
            )
            save()
    return save()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m reproductions.bu2021_jl.dpcore_tf_timing [--profile P] [--lots K]
    [--threads N] [--jl R ...]``."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description="Time dpcore's TensorFlow DP-Adam and DP-Adam-JL on the IMDb LSTM "
        "(Bu et al. 2021, Table 2).",
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--lots", type=int, help="timed lots per DP method (k)")
    parser.add_argument("--threads", type=int, help="TensorFlow threads (default: every core)")
    parser.add_argument("--jl", type=int, nargs="+", help="JL dimensions r (default: profile's)")
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--jl-dimension", type=int, help=argparse.SUPPRESS)
    for name in ("--config", "--data", "--checkpoint"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        fields = json.loads(args.config)
        config = DpcoreTfConfig(**{**fields, "jl_dimensions": tuple(fields["jl_dimensions"])})
        checkpoint = Path(args.checkpoint) if args.checkpoint else None
        row = worker(args.worker, config, Path(args.data), checkpoint, args.jl_dimension)
        protocol.emit_result(row)
        return 0
    path = compute(args.profile, lots=args.lots, threads=args.threads, jl_dimensions=args.jl)
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
