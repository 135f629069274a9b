"""Seconds to epsilon for DP-SGD (q = 0.01, sigma = 1, delta = 1e-5), dpcore vs dp_accounting.

Every (implementation, accountant, steps) cell is timed from an empty accountant to the answer
(construction + compose + get_epsilon), best of ``repeats``, all in one run so that ratios are
comparable. The peer's PLD is run at its default grid (1e-4) and at dpcore's final grid spacing
("matching accuracy"); dpcore's PLD row also carries its certified lower bound.

With ``--executor`` the cells of each step count run as one run of :func:`dpcore.runs.run_many`
on a worker, one run at a time (:func:`dpcore.runs.one_at_a_time`: no timing shares a machine
with another); every row records the machine that timed it (``hardware``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpcore.accountants.pld import PldAccountant
from dpcore.accountants.rdp import RdpAccountant
from dpcore.atomic import atomic_write_text
from dpcore.events import dpsgd_event
from dpcore.provenance import provenance
from dpcore.runs import ExecutorChoice, SupportsSubmit, machine, one_at_a_time, run_many

SAMPLING_PROBABILITY = 0.01
NOISE_MULTIPLIER = 1.0
DELTA = 1e-5
STEPS = (1_000, 10_000, 100_000)
REPEATS = 3


def _best(run: Callable[[], dict[str, Any]], repeats: int) -> dict[str, Any]:
    best: dict[str, Any] | None = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        seconds = time.perf_counter() - start
        if best is None or seconds < best["seconds"]:
            best = {**result, "seconds": seconds}
    assert best is not None
    return best


def _ours_rdp(steps: int) -> dict[str, Any]:
    accountant = RdpAccountant().compose(
        dpsgd_event(
            sampling_probability=SAMPLING_PROBABILITY,
            noise_multiplier=NOISE_MULTIPLIER,
            steps=steps,
        )
    )
    return {"epsilon": float(accountant.get_epsilon(DELTA))}


def _ours_pld(steps: int) -> dict[str, Any]:
    accountant = PldAccountant().compose(
        dpsgd_event(
            sampling_probability=SAMPLING_PROBABILITY,
            noise_multiplier=NOISE_MULTIPLIER,
            steps=steps,
        )
    )
    interval = accountant.get_epsilon_interval(DELTA)
    return {
        "epsilon": interval.upper,
        "epsilon_lower": interval.lower,
        "grid_spacing": interval.grid_spacing,
    }


def _peer_event(steps: int) -> dp_accounting.DpEvent:
    step = dp_accounting.PoissonSampledDpEvent(
        SAMPLING_PROBABILITY, dp_accounting.GaussianDpEvent(NOISE_MULTIPLIER)
    )
    return dp_accounting.SelfComposedDpEvent(step, steps)


def _peer_rdp(steps: int) -> dict[str, Any]:
    accountant = rdp_privacy_accountant.RdpAccountant()
    accountant.compose(_peer_event(steps))
    return {"epsilon": float(accountant.get_epsilon(DELTA))}


def _peer_pld(steps: int, spacing: float) -> dict[str, Any]:
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=spacing)
    accountant.compose(_peer_event(steps))
    return {"epsilon": float(accountant.get_epsilon(DELTA)), "grid_spacing": spacing}


# kind -> (implementation, accountant, timed function); dpcore's PLD runs before the matched peer.
_CELLS: dict[str, tuple[str, str, Callable[..., dict[str, Any]]]] = {
    "rdp": ("dpcore", "rdp", _ours_rdp),
    "pld": ("dpcore", "pld", _ours_pld),
    "peer_rdp": ("dp_accounting", "rdp", _peer_rdp),
    "peer_pld": ("dp_accounting", "pld", _peer_pld),
    "peer_pld_matched": ("dp_accounting", "pld_matched_grid", _peer_pld),
}


@dataclasses.dataclass(frozen=True)
class StepsCells:
    """Every cell of one step count, timed together on one machine (the matched peer grid is
    dpcore's PLD spacing at that count): a spec for :func:`measure_steps`."""

    steps: int
    repeats: int


def measure_steps(cells: StepsCells) -> list[dict[str, Any]]:
    """Time every cell of ``cells.steps`` here, one after another (best of ``cells.repeats``):
    one row per cell, each naming the machine that timed it (:func:`dpcore.runs.machine`)."""
    hardware = machine()
    steps = cells.steps
    rows: list[dict[str, Any]] = []
    ours_spacing: float | None = None
    for kind, (implementation, accountant, function) in _CELLS.items():
        arguments: tuple[Any, ...] = (steps,)
        if kind == "peer_pld":
            arguments = (steps, 1e-4)  # dp_accounting's default grid
        elif kind == "peer_pld_matched":
            arguments = (steps, ours_spacing)
        row = {
            "implementation": implementation,
            "accountant": accountant,
            **_best(functools.partial(function, *arguments), cells.repeats),
        }
        if kind == "pld":
            ours_spacing = row["grid_spacing"]
        rows.append({**row, "steps": steps, "hardware": hardware})
    return rows


def run(
    results_dir: Path,
    *,
    repeats: int = REPEATS,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> list[dict[str, Any]]:
    """Time every cell, write ``accounting.json`` (+ ``accounting.meta.json``), return rows.

    The cells of each step count (:class:`StepsCells`) are one run of
    :func:`dpcore.runs.run_many`, timed here (``executor`` None or ``"local"``) or on
    ``executor``, handed one run at a time (:func:`dpcore.runs.one_at_a_time`): no two timings
    ever share a machine, and each row names the machine that timed it (``hardware``). The
    ratios compare cells of one run, hence of one machine.

    Raises:
        InvalidParameterError: ``executor`` is not a valid choice (before anything runs).
    """
    units = [StepsCells(steps, repeats) for steps in STEPS]
    with one_at_a_time(executor) as chosen:
        timed = run_many(measure_steps, units, executor=chosen)
    rows = [row for unit in timed for row in unit]
    atomic_write_text(results_dir / "accounting.json", json.dumps(rows, indent=2) + "\n")
    ratios = {}
    for steps in STEPS:
        by = {
            (r["implementation"], r["accountant"]): r["seconds"]
            for r in rows
            if r["steps"] == steps
        }
        ratios[str(steps)] = {
            "pld_dpcore_over_dp_accounting_default": by[("dpcore", "pld")]
            / by[("dp_accounting", "pld")],
            "pld_dpcore_over_dp_accounting_matched": by[("dpcore", "pld")]
            / by[("dp_accounting", "pld_matched_grid")],
            "rdp_dpcore_over_dp_accounting": by[("dpcore", "rdp")] / by[("dp_accounting", "rdp")],
        }
    meta = provenance(
        root=Path(__file__).resolve().parents[1],
        benchmark="accounting",
        config={
            "sampling_probability": SAMPLING_PROBABILITY,
            "noise_multiplier": NOISE_MULTIPLIER,
            "delta": DELTA,
            "steps": list(STEPS),
            "repeats": repeats,
        },
        dp_accounting=getattr(dp_accounting, "__version__", "0.6.0"),
        time_ratios=ratios,
    )
    atomic_write_text(results_dir / "accounting.meta.json", json.dumps(meta, indent=2) + "\n")
    return rows
