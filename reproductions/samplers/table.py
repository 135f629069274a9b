"""Compute the sampler table (``figures/sampler_table.json``) and write it into its page.

Per setting of :mod:`reproductions.samplers.settings`, at delta = 1e-5:

* Poisson at q = B / N: the PLD accountant's certified interval and the RDP upper bound;
* shuffled batches of B: the certified lower bound of :mod:`dpcore.accountants.shuffled`
  (no valid upper bound exists in dpcore; reporting the Poisson number for them is the error
  the table is about);
* balls in bins over N // B steps per epoch: the RDP accountant's certified upper bound on
  :class:`~dpcore.events.RandomAllocationEvent` epochs.

The table on the guide's Samplers page (``docs/guide/samplers.md``) is rendered from the saved
JSON only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpcore.accountants import PldAccountant, RdpAccountant
from dpcore.accountants.shuffled import shuffled_lower_bound
from dpcore.events import GaussianEvent, RandomAllocationEvent, SelfComposedEvent, dpsgd_event
from dpcore.runs import RunStore, run_many
from dpcore.runs.markers import write_between_markers
from reproductions.common import finite_or_none
from reproductions.harness import Executor, Output, fanning_out, spread
from reproductions.samplers.settings import DELTA, SETTINGS, Setting

STEM = "sampler_table"
ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "docs" / "guide" / "samplers.md"  # the page that holds the table
MARKERS = ("<!-- sampler-table:start -->", "<!-- sampler-table:end -->")


def row(setting: Setting) -> dict[str, Any]:
    """The epsilons of one setting under each sampler."""
    q = setting.batch_size / setting.dataset_size
    poisson = dpsgd_event(
        sampling_probability=q, noise_multiplier=setting.noise_multiplier, steps=setting.steps
    )
    interval = PldAccountant().compose(poisson).get_epsilon_interval(DELTA)
    balls = SelfComposedEvent(
        RandomAllocationEvent(setting.steps_per_epoch, GaussianEvent(setting.noise_multiplier)),
        setting.epochs,
    )
    shuffled = shuffled_lower_bound(
        noise_multiplier=setting.noise_multiplier,
        dataset_size=setting.dataset_size,
        batch_size=setting.batch_size,
        steps=setting.steps,
    )
    return {
        **dataclasses.asdict(setting),
        "steps": setting.steps,
        "delta": DELTA,
        "poisson_pld_lower": finite_or_none(interval.lower),
        "poisson_pld_upper": finite_or_none(interval.upper),
        "poisson_rdp": finite_or_none(RdpAccountant().compose(poisson).get_epsilon(DELTA)),
        "shuffled_lower_bound": finite_or_none(shuffled.epsilon(DELTA)),
        "balls_in_bins_rdp": finite_or_none(RdpAccountant().compose(balls).get_epsilon(DELTA)),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README table (epsilon at delta = 1e-5) from saved rows."""

    def number(value: float | None) -> str:
        return "inf" if value is None else f"{value:.3g}"

    def ratio(lower: float | None, poisson: float | None) -> str:
        if lower is None or poisson is None or poisson == 0:
            return "-"
        return f"{lower / poisson:.2g}×"  # noqa: RUF001

    lines = [
        "| setting | N, B, σ, epochs | Poisson (PLD, certified) | Poisson (RDP) "  # noqa: RUF001
        "| shuffled: lower bound | shuffled ÷ Poisson | balls in bins (RDP, certified) |",
        "|---|---|---|---|---|---|---|",
    ]
    for item in rows:
        lines.append(
            f"| {item['paper']}, {item['label']} "
            f"| {item['dataset_size']:,}, {item['batch_size']}, {item['noise_multiplier']:g}, "
            f"{item['epochs']} "
            f"| [{number(item['poisson_pld_lower'])}, {number(item['poisson_pld_upper'])}] "
            f"| {number(item['poisson_rdp'])} "
            f"| ≥ {number(item['shuffled_lower_bound'])} "
            f"| ≥ {ratio(item['shuffled_lower_bound'], item['poisson_pld_upper'])} "
            f"| ≤ {number(item['balls_in_bins_rdp'])} |"
        )
    return "\n".join(lines)


#: The code the rows depend on: a change here computes them afresh in the run store.
CODE_MODULES = ("dpcore.accountants", "dpcore.pld", "dpcore.events", __name__)


def compute(
    profile: str = "quick",
    *,
    output: Output | None = None,
    readme: Path | None = None,
    settings: Sequence[Setting] = SETTINGS,
    executor: Executor = None,
) -> None:
    """Save the table (the same in every profile: accounting only, seconds) and the README.

    Each setting's row (:func:`row`, independent) is a run of :func:`dpcore.runs.run_many`:
    here, one after another (``executor`` None or ``"local"``), or at once on ``executor``, then
    kept in the run store (``<runs>/<STEM>``, keyed by :data:`CODE_MODULES`), where a later run
    reads it back.

    Raises:
        InvalidParameterError: ``executor`` is invalid (before anything runs).
        RunsFailedError: runs still failed after one retry.
    """
    fanned = fanning_out(executor)
    output = output or Output()
    store = None
    if fanned is not None:
        store = RunStore(output.store(STEM), code=output.code(*CODE_MODULES))
    rows = run_many(row, list(settings), executor=fanned, store=store, progress=False)
    output.save_results(
        STEM,
        config={"delta": DELTA, "settings": len(settings)},
        rows=rows,
        extra={"runs_spread": spread(fanned)},
    )
    write_between_markers(readme or README, *MARKERS, markdown(output.load_results(STEM)["rows"]))


def plot() -> None:
    """Nothing to draw: the result is a table."""
