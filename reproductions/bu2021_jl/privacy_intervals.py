"""Epsilon intervals of the Bu et al. 2021 training reproductions (Fig. 4 and the Fig. 1 summary).

One Poisson-subsampled step is a Gaussian event (exact per-example clipping) or a JL-Gaussian
event (r random projections, Lemma 4.1 / Thm 4.1 of arXiv 2102.03013). :func:`method_privacy`
certifies ``[lower, upper]`` epsilon intervals after the steps run and after the paper's schedule,
with the tight PLD accountant for exact clipping and :class:`dpcore.accountants.JlAccountant` for
JL; :func:`fmt_interval` writes one for a legend or a README table. Used by
:mod:`reproductions.bu2021_jl.accuracy` and :mod:`reproductions.bu2021_jl.summary`.
"""

from __future__ import annotations

from typing import Any

from dpcore.accountants.report import epsilon_report
from dpcore.events import (
    DpEvent,
    GaussianEvent,
    JLGaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
)


def step_event(sampling_probability: float, noise_multiplier: float, r: int | None) -> DpEvent:
    """One Poisson-subsampled step: Gaussian (exact clipping) or JL-Gaussian (r projections)."""
    inner = GaussianEvent(noise_multiplier) if r is None else JLGaussianEvent(noise_multiplier, r)
    return PoissonSampledEvent(sampling_probability, inner)


def epsilon_interval(
    event: DpEvent, *, delta: float, jl_bins: int, jl: bool, count: int = 1
) -> dict[str, Any]:
    """Certified ``[lower, upper]`` epsilon of ``count`` x ``event``: JL accountant or tight PLD."""
    name = "jl" if jl else "pld"
    composed = event if count == 1 else SelfComposedEvent(event, count)
    report = epsilon_report(composed, delta, (name,), jl_bins=jl_bins)
    return {
        "accountant": name,
        "jl_bins": jl_bins if jl else None,
        "lower": report[f"epsilon_{name}_lower"],
        "upper": report[f"epsilon_{name}_upper"],
    }


def method_privacy(
    step: DpEvent,
    *,
    jl: bool,
    steps: int,
    paper_steps: int,
    delta: float,
    jl_bins: int,
    run_event: DpEvent | None = None,
) -> dict[str, Any]:
    """Epsilon intervals after ``steps`` steps (``run_event``, e.g. the ledger's, if given) and
    after the paper's ``paper_steps``; JL accountant if ``jl``, else tight PLD."""
    run = epsilon_interval(
        run_event if run_event is not None else SelfComposedEvent(step, steps),
        delta=delta,
        jl_bins=jl_bins,
        jl=jl,
    )
    paper = (
        run
        if paper_steps == steps
        else epsilon_interval(step, count=paper_steps, delta=delta, jl_bins=jl_bins, jl=jl)
    )
    return {"run": run, "steps": steps, "paper_schedule": paper, "paper_steps": paper_steps}


def fmt_interval(interval: dict[str, Any]) -> str:
    """``[lower, upper]`` with ``inf`` for an unbounded (null) end; one number if they agree."""

    def one(value: float | None) -> str:
        return "inf" if value is None else f"{value:.3g}"

    lower, upper = interval["lower"], interval["upper"]
    if lower is not None and upper is not None and one(lower) == one(upper):
        return one(lower)
    return f"[{one(lower)}, {one(upper)}]"
