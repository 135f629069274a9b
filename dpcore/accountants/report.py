"""One event, every accountant: the epsilons a results table prints side by side.

:func:`epsilon_report` composes an event with each named accountant and returns plain numbers
(``None`` for an infinite epsilon, so the result is valid JSON). Only
:class:`~dpcore.accountants.rdp.OrderGridEdgeWarning` is silenced: an optimum at the edge of the
order grid leaves the RDP/moments bound valid (only possibly loose), whereas every other warning
(a sampler mismatch, a numerical note) still reaches the caller.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

from dpcore.accountants.base import accountant_class
from dpcore.accountants.gdp_clt import GdpCltAccountant
from dpcore.accountants.jl import JlAccountant
from dpcore.accountants.pld import PldAccountant
from dpcore.accountants.rdp import OrderGridEdgeWarning
from dpcore.errors import InvalidParameterError
from dpcore.events import DpEvent
from dpcore.validation import check_delta

__all__ = ["REPORT_ACCOUNTANTS", "epsilon_report", "json_number"]

#: What :func:`epsilon_report` accepts: the registered accountants' names.
REPORT_ACCOUNTANTS = ("basic", "advanced", "moments", "rdp", "gdp_clt", "pld", "jl")


def json_number(value: float) -> float | None:
    """``float(value)``, or ``None`` for an infinite one (JSON has no infinity).

    Example:
        >>> json_number(1.5), json_number(float("inf"))
        (1.5, None)
    """
    number = float(value)
    return None if math.isinf(number) else number


def epsilon_report(
    event: DpEvent,
    delta: float,
    accountants: Sequence[str] = ("moments", "rdp", "gdp_clt", "pld"),
    *,
    jl_bins: int | None = None,
) -> dict[str, Any]:
    """Epsilon of ``event`` at ``delta`` under each accountant in ``accountants``.

    Keys: ``epsilon_<name>`` for the single-number accountants (``gdp_clt`` also gives
    ``mu_clt``; its epsilon is the CLT's approximation, not a bound, Bu et al. 2019 Thm 5),
    ``epsilon_<name>_lower`` / ``epsilon_<name>_upper`` for the certified intervals of ``pld``
    and ``jl`` (``jl_bins`` sets the JL accountant's shift-law bins, its default otherwise).

    Raises:
        InvalidParameterError: ``delta`` outside (0, 1), or an unknown accountant name.

    Example:
        >>> from dpcore.events import dpsgd_event
        >>> event = dpsgd_event(sampling_probability=0.01, noise_multiplier=4.0, steps=10_000)
        >>> report = epsilon_report(event, 1e-5, ("moments", "gdp_clt"))
        >>> round(report["epsilon_moments"], 2), round(report["mu_clt"], 3)
        (1.26, 0.254)
    """
    check_delta("delta", delta)
    unknown = [name for name in accountants if name not in REPORT_ACCOUNTANTS]
    if unknown or not accountants:
        raise InvalidParameterError("accountants", f"names among {REPORT_ACCOUNTANTS}", unknown)
    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderGridEdgeWarning)
        for name in accountants:
            if name in ("pld", "jl"):
                accountant = (
                    PldAccountant()
                    if name == "pld"
                    else JlAccountant()
                    if jl_bins is None
                    else JlAccountant(bins=jl_bins)
                )
                interval = accountant.compose(event).get_epsilon_interval(delta)
                out[f"epsilon_{name}_lower"] = json_number(interval.lower)
                out[f"epsilon_{name}_upper"] = json_number(interval.upper)
            elif name == "gdp_clt":
                clt = GdpCltAccountant().compose(event)
                out["mu_clt"] = json_number(clt.mu)
                out["epsilon_gdp_clt"] = json_number(clt.get_epsilon(delta))
            else:
                composed = accountant_class(name)().compose(event)
                out[f"epsilon_{name}"] = json_number(composed.get_epsilon(delta))
    return out
