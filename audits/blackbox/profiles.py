"""The settings each profile audits, the claims, and how many runs per world.

The claims are issue 34's grid, epsilon in {1, 2, 4, 8, 10} at delta = 1e-5.

``quick`` (part of ``nox -s audit``, about two minutes on one core): the strongest setting with
100 runs per world at epsilon 1, 4 and 10 -- the two ends of the grid and its middle (the
claims of the earlier quick results, so rows compare across versions); 2 and 8 lie between
rows it has and would add two fifths to its time. ``full``: every claim; the strongest setting
with many runs, one setting for each choice it combines changed back to a weaker one (a
mislabelled real image, an in-distribution target, a random initialisation, Poisson lots with
q = 0.1), so that each choice is measured; the strongest setting trained by Opacus 1.6; the
MNIST CNN (dpcore and Opacus); and the whole of MNIST's training split (60,000 records, full
batch; dpcore and Opacus).

Runs per world follow the cost of a run (seconds of one thread at d884f36, on the Xeon of the
committed results): logistic regression on 1,000 records about 0.2 (Opacus about 2.6), the CNN
8.4 (Opacus 15.6; its worst-case initial parameters take 304 once per process), logistic
regression on 60,000 records 14.2 (Opacus 149: its loader gathers a lot record by record and
its hooks hold every record's gradient, so it gets 20 runs per world). The whole full profile
is then about 21 hours of one core. The CNN on 60,000 records works (``model="cnn",
subset_size=60_000, init="random"``) but is not audited: a full-batch step takes about 16 s
(Opacus 24), a run of 50 steps about 13 minutes (Opacus 20); Poisson lots would
make steps cheap but leave only the Clopper-Pearson route, which bounds near 0 at a few hundred
runs (the q = 0.1 rows).
"""

from __future__ import annotations

import dataclasses

from audits.blackbox.settings import BlackBoxSetting, check_setting
from dpcore.errors import InvalidParameterError
from dpcore.validation import check_count

__all__ = ["EPSILONS", "PROFILES", "QUICK_EPSILONS", "Profile", "profile"]

#: The claims audited (delta = 1e-5).
EPSILONS = (1.0, 2.0, 4.0, 8.0, 10.0)
#: The quick profile's claims (see the module docstring).
QUICK_EPSILONS = (1.0, 4.0, 10.0)

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


#: Train with Opacus 1.6's PrivacyEngine (:mod:`audits.blackbox.opacus_training`).
OPACUS = {"implementation": "opacus"}
#: The TensorFlow Privacy tutorial's MNIST CNN (26,010 parameters), otherwise as the strongest.
CNN = {"model": "cnn"}
#: All of MNIST's training split, full batch. Random initialisation: pre-training needs records
#: outside the training set, and none of the training split is left.
FULL_MNIST = {"subset_size": 60_000, "init": "random"}

PROFILES = {
    "quick": Profile("quick", ((STRONGEST, 100),), epsilons=QUICK_EPSILONS),
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
            (_variant("Opacus: worst-case init, blank target, full batch", **OPACUS), 200),
            (_variant("CNN, worst-case init, blank target, full batch", **CNN), 100),
            (
                _variant("Opacus CNN: worst-case init, blank target, full batch", **CNN, **OPACUS),
                100,
            ),
            (_variant("60,000 records, random init, blank target, full batch", **FULL_MNIST), 100),
            (
                _variant(
                    "Opacus, 60,000 records: random init, blank target, full batch",
                    **FULL_MNIST,
                    **OPACUS,
                ),
                20,
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
