"""From per-seed test rows to decisions whose family-wise error is the stated level.

Every audit row carries a p-value for "the implementation is the correct DP-SGD its claim
describes". One call of :func:`~dpcore.auditing.implementation_audits.audit_implementation`
combines each audit's seeds by Fisher's method (-2 sum log p ~ chi^2 with 2 n degrees of
freedom; valid for independent seeds, conservative for conservative p-values) and then decides
all its audits together by Holm's step-down procedure at ``level``: the probability that a
correct implementation gets *any* flag is at most ``level`` (Holm 1979), whatever the
dependence between the audits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from scipy import stats

from dpcore.auditing import multiple_testing

#: The verdict of each audit that rejects the claim.
FLAGGED = {
    "whitebox_per_step": "violation",
    "one_run": "violation",
    "noise_calibration": "noise does not match the claim",
    "noise_per_tensor": "noise of a tensor or parameter group does not match the claim",
    "canary_per_tensor": "clipped contribution does not match the claim",
    "noise_correlation": "noise correlated across steps",
    "empty_lots": "empty lots not noised as claimed",
    "sampler": "sampling does not match the claimed analysis",
    "sampler_lots": "sampling does not match the claimed analysis",
}

#: The rows :func:`~dpcore.auditing.implementation_audits.whitebox_audit` gives.
WHITEBOX_AUDITS = (
    "whitebox_per_step",
    "noise_calibration",
    "noise_per_tensor",
    "canary_per_tensor",
    "noise_correlation",
    "empty_lots",
    "sampler_lots",
)

#: the order of the audits in summaries
AUDIT_ORDER = (*WHITEBOX_AUDITS, "one_run", "sampler")


def holm(p_values: Sequence[float], level: float) -> list[bool]:
    """Holm's step-down rejections at family-wise level ``level`` (True: rejected).

    :func:`dpcore.auditing.multiple_testing.holm` as a list.

    >>> holm([0.01, 0.04, 0.03], 0.05)
    [True, False, False]
    """
    return list(multiple_testing.holm(p_values, level=level))


def fisher(p_values: Sequence[float]) -> float:
    """Fisher's combination of independent p-values (one p-value is itself)."""
    if len(p_values) == 1:
        return float(p_values[0])
    statistic = -2 * sum(math.log(max(p, 1e-300)) for p in p_values)
    return float(stats.chi2.sf(statistic, 2 * len(p_values)))


#: keys of the first seed's row copied into its summary
DETAIL_KEYS = (
    "task",
    "noise_std_ratio",
    "shuffled_epsilon_lower_bound",
    "windows_with_one_inclusion",
    "windows",
    "expected_under_poisson",
    "sampler_seen",
    "mu_lower",
    "mu_lower_threshold",
    "mu_claimed",
    "epsilon_lower_threshold",
    "epsilon_lower_fdp",
    "mu_lower_fdp",
    "lag1_correlation",
    "z",
    "tensors",
    "parts",
    "empty_lots",
    "canary_steps",
    "note",
    "bound_note",
)


def not_applicable_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The summary row of an audit that could not run on this implementation."""
    first = rows[0]
    return {
        "implementation": first["implementation"],
        "audit": first["audit"],
        "claimed_epsilon": None,
        "certified_epsilon": None,
        "epsilon_lower": None,
        "confidence": None,
        "p_value": None,
        "verdict": f"not applicable ({first['not_applicable']})",
        "seeds": len(rows),
    }


def summarise(
    rows: Sequence[dict[str, Any]], level: float = 0.05, false_alarms: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One row per (implementation, audit): seeds combined (Fisher), audits decided (Holm).

    Holm runs over the audits of each implementation (one family per implementation). A summary
    has ``p_value`` (the combined one), ``verdict``, ``holm_threshold`` (the p-value it had to
    fall below), ``epsilon_lower`` (seed 0's, None where no epsilon bound holds),
    ``epsilon_lower_per_seed``, ``flagged_seeds`` (seeds whose own p is below ``level``),
    ``seeds`` and ``false_alarm_rate`` (measured on correct implementations, if given).
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["implementation"], row["audit"]), []).append(row)
    names = list(dict.fromkeys(name for name, _ in groups))
    ordered = sorted(groups, key=lambda k: (names.index(k[0]), AUDIT_ORDER.index(k[1])))
    out: list[dict[str, Any]] = []
    for name in names:
        keys = [k for k in ordered if k[0] == name]
        tested = [k for k in keys if "not_applicable" not in groups[k][0]]
        combined = {k: fisher([r["p_value"] for r in groups[k]]) for k in tested}
        decided = holm([combined[k] for k in tested], level) if tested else []
        decisions = dict(zip(tested, decided, strict=True))
        for key in keys:
            group = groups[key]
            if key not in combined:
                out.append(not_applicable_summary(group))
                continue
            out.append(_summary(group, combined[key], decisions[key], level, len(tested)))
            out[-1]["holm_threshold"] = _threshold(combined, key, level)
            if false_alarms is not None:
                out[-1]["false_alarm_rate"] = false_alarms.get("rate")
    return out


def _threshold(combined: dict[tuple[str, str], float], key: tuple[str, str], level: float) -> float:
    """The Holm threshold level / (m - rank) of this audit's p-value."""
    rank = sorted(combined.values()).index(combined[key])
    return level / (len(combined) - rank)


def _summary(
    rows: Sequence[dict[str, Any]], p_value: float, rejected: bool, level: float, family: int
) -> dict[str, Any]:
    first = rows[0]
    lowers = [r.get("epsilon_lower") for r in rows]
    summary = {
        "implementation": first["implementation"],
        "audit": first["audit"],
        "claimed_epsilon": first.get("claimed_epsilon"),
        "claimed_accountant": first.get("claimed_accountant", ""),
        "certified_epsilon": first.get("certified_epsilon"),
        "certified": first.get("certified"),
        "epsilon_lower": first.get("epsilon_lower"),
        "epsilon_lower_per_seed": [v for v in lowers if v is not None],
        "confidence": first.get("confidence"),
        "p_value": p_value,
        "combined_p_value": p_value if len(rows) > 1 else None,
        "level": level,
        "tests_in_family": family,
        "verdict": FLAGGED[first["audit"]] if rejected else "consistent",
        "seeds": len(rows),
        "flagged_seeds": sum(r["p_value"] < level for r in rows),
        "claim": first.get("claim"),
    }
    for key in DETAIL_KEYS:
        if key in first:
            summary[key] = first[key]
    return summary


class AuditReport(list[dict[str, Any]]):
    """The summary rows of one call (a list), with every seed's rows in :attr:`seed_rows`."""

    def __init__(
        self,
        rows: Sequence[dict[str, Any]],
        seed_rows: Sequence[dict[str, Any]],
        level: float,
        false_alarms: dict[str, Any] | None,
    ) -> None:
        super().__init__(rows)
        self.seed_rows = list(seed_rows)
        self.level = level
        self.false_alarms = false_alarms

    @property
    def flagged(self) -> bool:
        """Whether any audit rejected the claim (family-wise error at most :attr:`level`)."""
        return any(
            row["verdict"] != "consistent" and not str(row["verdict"]).startswith("not applicable")
            for row in self
        )
