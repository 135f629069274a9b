"""The settings each profile audits, the claims, and how many runs per world.

``quick`` (part of ``nox -s audit``, minutes on 2 cores): the strongest setting at every claim
with few runs. ``full``: that setting with many runs, and one setting for each choice it
combines changed back to a weaker one (a mislabelled real image, an in-distribution target, a
random initialisation, Poisson lots with q = 0.1), so that each choice is measured.
"""

from __future__ import annotations

import dataclasses

from audits.blackbox.settings import BlackBoxSetting, check_setting
from dpcore.errors import InvalidParameterError
from dpcore.validation import check_count

__all__ = ["EPSILONS", "PROFILES", "Profile", "profile"]

#: The claims audited (delta = 1e-5).
EPSILONS = (1.0, 4.0, 10.0)

STRONGEST = BlackBoxSetting()


@dataclasses.dataclass(frozen=True)
class Profile:
    """(setting, runs per world) pairs audited at each of ``epsilons``, in order."""

    name: str
    audits: tuple[tuple[BlackBoxSetting, int], ...]
    epsilons: tuple[float, ...] = EPSILONS

    def __post_init__(self) -> None:
        for setting, runs in self.audits:
            check_setting(setting)
            check_count("runs per world", runs, minimum=8)


def _variant(name: str, **changes: object) -> BlackBoxSetting:
    return dataclasses.replace(STRONGEST, name=name, **changes)  # type: ignore[arg-type]


PROFILES = {
    "quick": Profile("quick", ((STRONGEST, 100),)),
    "full": Profile(
        "full",
        (
            (STRONGEST, 1000),
            (
                _variant("worst-case init, mislabelled target, full batch", target="mislabelled"),
                200,
            ),
            (_variant("worst-case init, natural target, full batch", target="natural"), 200),
            (_variant("random init, blank target, full batch", init="random"), 200),
            (
                _variant(
                    "worst-case init, blank target, q = 0.1, 100 steps",
                    sampling_probability=0.1,
                    steps=100,
                    lr=0.1,
                ),
                200,
            ),
        ),
    ),
}


def profile(name: str) -> Profile:
    """The profile called ``name``.

    Raises:
        InvalidParameterError: ``name`` is not one of :data:`PROFILES`.
    """
    if name not in PROFILES:
        raise InvalidParameterError("profile", f"in {sorted(PROFILES)}", name)
    return PROFILES[name]
