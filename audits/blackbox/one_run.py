"""One-run black-box membership audit with designed canaries (Steinke, Nasr, Jagielski 2023).

One DP-SGD training (the multi-run audit's model, worst-case initial parameters, noise
calibration and training loop from :mod:`audits.blackbox.training`: dpcore's DPTrainer, or
Opacus 1.6 where the base setting says so) on the 1,000-record MNIST subset (or the whole
training split, where the base setting says 60,000) plus m *designed canaries*, each
included independently with probability 1/2 (the secret bits, from a seeded generator).
The canaries are records built to be memorable and to interfere little with one another
(:data:`DESIGNS`):

- ``"sparse"``: a blank image with ``pixels`` random pixels set to 1;
- ``"dense"``: an out-of-distribution image of random +-1 pixels (nearly orthogonal to every
  other canary and to the real records' mean direction);
- ``"orthogonal"``: out-of-distribution images that are exactly orthogonal to one another (the
  rows of a random orthogonal matrix, scaled to the norm 28 of a +-1 image; at most 784), so
  that in the linear model one canary's weight gradients move no other canary's logits (only
  the shared bias, a 1/785 part of a clipped gradient's squared norm, does);

labelled either at random (``labels="random"``) or with the class the initial model finds
least likely (``"least_likely"``: the auditor chose the initial parameters, so it knows them;
the canary's gradient is then large and points the same way for the whole training).

The auditor sees the final model's outputs on the canaries only. A canary's score is the gain
of its logit margin ``z_y - logsumexp_{k != y} z_k`` (Carlini et al. 2022) over the same margin
under the initial parameters, which the auditor chose before training and which do not depend
on the bits (so the score is a function of the final model alone; subtracting removes each
canary's own offset). It guesses "in" for the ``guesses_each_side`` highest scores and "out"
for as many lowest (fixed in the setting, before any training), counts the right guesses v and
bounds epsilon from (m, r, v) two ways, each at 1 - 0.05 / 2 = 97.5 % so that both hold
together at 95 % (Bonferroni):

- Thm 5.2 of Steinke, Nasr, Jagielski 2023 (arXiv 2305.08846;
  :func:`dpcore.auditing.one_run_epsilon_lower_bound`), valid for any (epsilon, delta)-DP
  training;
- the f-DP one-run bound for Gaussian DP of Mahloujifar, Melis, Chaudhuri 2025 (arXiv
  2410.22235; :func:`dpcore.auditing.one_run_fdp.one_run_gdp_lower_bound`), valid where the
  training is mu-GDP with respect to each canary: full-batch DP-SGD is sqrt(T)/sigma-GDP by
  construction; with q < 1 it is not (only in the CLT limit), so that route is not run there
  and Thm 5.2 gets the whole 95 %.

The noise multiplier is the PLD-calibrated one for the claim at (q, T, delta): the guarantee is
per record, and every canary is a record (clipped to C, sampled like the others), so the claim
covers each canary. The noisy sum is divided by a public constant, :func:`public_divisor`
(q times the expected number of records, subset plus m / 2), the same whatever the bits: q times
the run's own training set would make the divisor count the included canaries, which the DP
analysis does not cover (as in :mod:`audits.blackbox.training`). Trainings are run specs
(:class:`OneRunSpec`) executed through :func:`dpcore.runs.run_many` into the run store
``audits/results/runs/blackbox_one_run``.

``python -m audits --only blackbox_one_run --profile quick|full [--executor processes:2]``
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from audits import results_io
from audits.blackbox import data, settings, training
from audits.blackbox.selection import chosen as chosen_names
from audits.blackbox.selection import in_profile_order, merged, previous_rows
from audits.blackbox.settings import BlackBoxSetting
from audits.dpsgd_whitebox import single_thread
from audits.results_io import run_store, save
from dpcore.auditing import one_run_epsilon_lower_bound
from dpcore.auditing.one_run_fdp import one_run_gdp_lower_bound
from dpcore.errors import InvalidParameterError
from dpcore.runs import ExecutorChoice, RunStore, SupportsSubmit, machine, run_many
from dpcore.validation import check_count, check_positive, check_seed

__all__ = [
    "ANCHORS",
    "DESIGNS",
    "LABELS",
    "PROFILES",
    "OneRunSetting",
    "OneRunSpec",
    "Profile",
    "audit",
    "bits",
    "canaries",
    "check_setting",
    "check_spec",
    "decide",
    "execute",
    "noise_seed",
    "public_divisor",
    "results_name",
    "run",
    "store",
]

#: The canary images (see the module docstring).
DESIGNS = ("sparse", "dense", "orthogonal")
#: How canaries are labelled (see the module docstring).
LABELS = ("random", "least_likely")
#: The level of the bounds of one training together.
CONFIDENCE = 0.95

#: Published one-run results the table is read against.
ANCHORS = (
    {
        "source": "Panda et al., ICLR 2025 (LLM fine-tuning, designed canaries, black-box)",
        "epsilon": 4.0,
        "epsilon_lower": 1.0,
        "ratio": 0.25,
    },
    {
        "source": "Steinke, Nasr, Jagielski, NeurIPS 2023 (white-box, gradient canaries)",
        "epsilon": 4.0,
        "epsilon_lower": 1.8,
        "ratio": 0.45,
    },
)


@dataclasses.dataclass(frozen=True)
class OneRunSetting:
    """What one audited training is: the multi-run audit's ``base`` setting (subset, model,
    initial parameters, q, steps, learning rate, clipping norm, delta, seed; its target fields
    are unused) plus ``canaries`` records of ``design`` labelled by ``labels``, and the number
    of guesses on each side (fixed before training)."""

    name: str
    design: str = "dense"
    labels: str = "least_likely"
    canaries: int = 1000
    guesses_each_side: int = 50
    pixels: int = 16
    base: BlackBoxSetting = dataclasses.field(default_factory=BlackBoxSetting)


@dataclasses.dataclass(frozen=True)
class OneRunSpec:
    """One training: ``setting`` at the claim ``epsilon``, with run seed ``seed`` (bits, noise
    and lots)."""

    setting: OneRunSetting
    epsilon: float
    seed: int


def check_setting(setting: OneRunSetting) -> OneRunSetting:
    """Return ``setting`` after checking every field.

    Raises:
        InvalidParameterError: an unknown design or labelling, fewer than 2 canaries (or more
            than 784 orthogonal ones), guesses
            on each side below 1 or above half the canaries, pixels outside 1..784, or a bad
            base setting (see :func:`audits.blackbox.settings.check_setting`).
    """
    if not isinstance(setting, OneRunSetting):
        raise InvalidParameterError("setting", "to be a OneRunSetting", setting)
    if not isinstance(setting.name, str) or not setting.name:
        raise InvalidParameterError("name", "a non-empty str", setting.name)
    if setting.design not in DESIGNS:
        raise InvalidParameterError("design", f"in {list(DESIGNS)}", setting.design)
    if setting.labels not in LABELS:
        raise InvalidParameterError("labels", f"in {list(LABELS)}", setting.labels)
    m = check_count("canaries", setting.canaries, minimum=2)
    k = check_count("guesses_each_side", setting.guesses_each_side, minimum=1)
    if 2 * k > m:
        raise InvalidParameterError("guesses_each_side", f"<= canaries / 2 = {m // 2}", k)
    if setting.design == "orthogonal" and m > 784:
        raise InvalidParameterError("canaries", "<= 784 for orthogonal canaries", m)
    pixels = check_count("pixels", setting.pixels, minimum=1)
    if pixels > 784:
        raise InvalidParameterError("pixels", "in 1..784", pixels)
    settings.check_setting(setting.base)
    return setting


def check_spec(spec: OneRunSpec) -> OneRunSpec:
    """Return ``spec`` after checking it and its setting.

    Raises:
        InvalidParameterError: a bad setting, an epsilon not > 0 and finite, or a seed outside
            [0, 2**63).
    """
    if not isinstance(spec, OneRunSpec):
        raise InvalidParameterError("spec", "to be a OneRunSpec", spec)
    check_setting(spec.setting)
    epsilon = check_positive("epsilon", spec.epsilon)
    if not math.isfinite(epsilon):
        raise InvalidParameterError("epsilon", "finite", epsilon)
    check_seed("seed", spec.seed)
    return spec


def canaries(setting: OneRunSetting) -> tuple[np.ndarray, np.ndarray]:
    """The m canaries of ``setting``: (m, 784) float32 images and (m,) int64 labels, fixed by
    the base setting's seed (the same for every claim and run seed)."""
    check_setting(setting)
    rng = np.random.default_rng([setting.base.seed, 1 + DESIGNS.index(setting.design)])
    m = setting.canaries
    labels = rng.integers(0, 10, size=m).astype(np.int64)
    if setting.design == "dense":
        images = rng.choice(np.array([-1.0, 1.0], np.float32), size=(m, 784))
    elif setting.design == "orthogonal":
        basis, _ = np.linalg.qr(rng.normal(size=(784, 784)))
        images = (28.0 * basis[:m]).astype(np.float32)
    else:
        images = np.zeros((m, 784), np.float32)
        for row in images:
            row[rng.choice(784, size=setting.pixels, replace=False)] = 1.0
    if setting.labels == "least_likely":
        model = _initial_model(setting.base)
        with torch.no_grad():
            labels = model(torch.from_numpy(images)).argmin(1).numpy().astype(np.int64)
    return images, labels


def _initial_model(base: BlackBoxSetting) -> nn.Module:
    model = training.make_model(base)
    model.load_state_dict(training.initial_state(base))
    return model


def _entropy(spec: OneRunSpec) -> list[int]:
    """What seeds a run: the run seed and everything that tells settings apart (base seed,
    design, labels, m, q, steps), so that no two settings of a profile share bits or noise."""
    setting, base = spec.setting, spec.setting.base
    return [
        base.seed,
        spec.seed,
        DESIGNS.index(setting.design),
        LABELS.index(setting.labels),
        setting.canaries,
        round(base.sampling_probability * 1e6),
        base.steps,
    ]


def noise_seed(spec: OneRunSpec) -> int:
    """The seed of a run's noise and lots, in [0, 2**63): a hash (numpy's SeedSequence) of
    the run's entropy and the claim, so no two claims or settings share noise draws."""
    entropy = [*_entropy(check_spec(spec)), round(spec.epsilon * 1e6)]
    state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)
    return int(state[0] >> np.uint64(1))


def bits(spec: OneRunSpec) -> np.ndarray:
    """The canaries' inclusion bits of a run: independent fair coins (bool, length m), from a
    generator seeded by the run's entropy without the claim (the same bits at every claim of a
    setting and run seed, different bits for different settings or run seeds)."""
    rng = np.random.default_rng([*_entropy(check_spec(spec)), 7])
    return rng.random(spec.setting.canaries) < 0.5


def public_divisor(setting: OneRunSetting) -> float:
    """The divisor of every noisy sum: ``sampling_probability * (subset_size + canaries / 2)``,
    fixed by the setting before any bit is drawn.

    Raises:
        InvalidParameterError: a bad setting.
    """
    base = check_setting(setting).base
    return base.sampling_probability * (base.subset_size + setting.canaries / 2)


def _margins(model: nn.Module, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The logit margins ``z_y - logsumexp_{k != y} z_k`` (float64)."""
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(images)).double()
    own = logits.gather(1, torch.from_numpy(labels)[:, None])[:, 0]
    others = logits.scatter(1, torch.from_numpy(labels)[:, None], -math.inf)
    margins: np.ndarray = (own - torch.logsumexp(others, 1)).numpy()
    return margins


def execute(spec: OneRunSpec) -> dict[str, Any]:
    """Train ``spec``'s model (one torch thread) on the subset plus the included canaries, with
    the base setting's implementation (:func:`audits.blackbox.training.fit`: dpcore or Opacus).

    Returns:
        ``{"bits": [0/1] * m, "scores": [margin gain] * m, "noise_multiplier": sigma,
        "seconds": ...}`` (JSON values).

    Raises:
        InvalidParameterError: a bad spec.
    """
    start = time.perf_counter()
    base = check_spec(spec).setting.base
    sigma = training.noise_multiplier(
        spec.epsilon, base.delta, base.sampling_probability, base.steps
    )
    seed = noise_seed(spec)
    included = bits(spec)
    with single_thread():
        images, labels = canaries(spec.setting)
        x, y = data.subset(base)
        x = np.concatenate([x, images[included]])
        y = np.concatenate([y, labels[included]])
        before = _margins(_initial_model(base), images, labels)
        model = training.fit(
            base,
            x,
            y,
            seed=seed,
            noise_multiplier=sigma,
            # the implementations divide by q times the run's training set: it counts the bits
            divisor=public_divisor(spec.setting),
        )
        after = _margins(model, images, labels)
    return {
        "bits": included.astype(int).tolist(),
        "scores": (after - before).tolist(),
        "noise_multiplier": sigma,
        "seconds": time.perf_counter() - start,
    }


def decide(
    scores: list[float] | np.ndarray,
    included: list[int] | np.ndarray,
    *,
    guesses_each_side: int,
    delta: float,
    gdp: bool,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """Guess, count and bound: "in" for the k highest scores, "out" for the k lowest.

    Ties are broken by canary index (stable sort), so the guesses depend on the scores only.
    With ``gdp`` both bounds are made at 1 - (1 - confidence) / 2 (Bonferroni); without, Thm
    5.2 alone at ``confidence``.

    Raises:
        InvalidParameterError: scores and bits of different lengths or not finite / not 0-1,
            k below 1 or above m / 2, or a bad delta or confidence.
    """
    values = np.asarray(scores, dtype=float)
    truth = np.asarray(included)
    if values.ndim != 1 or values.shape != truth.shape:
        raise InvalidParameterError(
            "scores and bits", "1-D and of one length", (values.shape, truth.shape)
        )
    if not np.all(np.isfinite(values)):
        raise InvalidParameterError("scores", "finite", "NaN or inf")
    if not np.isin(truth, (0, 1)).all():
        raise InvalidParameterError("bits", "0 or 1", sorted(set(truth.tolist())))
    m = values.size
    k = check_count("guesses_each_side", guesses_each_side, minimum=1)
    if 2 * k > m:
        raise InvalidParameterError("guesses_each_side", f"<= canaries / 2 = {m // 2}", k)
    order = np.argsort(values, kind="stable")
    correct = int(truth[order[-k:]].sum() + (1 - truth[order[:k]]).sum())
    each = 1 - (1 - confidence) / 2 if gdp else confidence
    steinke = one_run_epsilon_lower_bound(
        canaries=m, guesses=2 * k, correct=correct, delta=delta, confidence=each
    )
    result: dict[str, Any] = {
        "canaries": m,
        "guesses": 2 * k,
        "correct": correct,
        "confidence": confidence,
        "confidence_each": each,
        "epsilon_lower_steinke": steinke.epsilon_lower,
        "epsilon_lower_gdp": None,
        "mu_lower_gdp": None,
    }
    if gdp:
        bound = one_run_gdp_lower_bound(
            canaries=m, guesses=2 * k, correct=correct, delta=delta, confidence=each
        )
        result["epsilon_lower_gdp"] = bound.epsilon_lower
        result["mu_lower_gdp"] = bound.mu_lower
    return result


#: The code that determines a run's result (its fingerprint keys the run store).
SOURCES = (
    sys.modules[__name__],
    data,
    settings,
    training,
    "dpcore.calibration",
    "dpcore.data.datasets",
    "dpcore.torch.noise",
    "dpcore.torch.optimizers",
    "dpcore.torch.per_example.fast",
    "dpcore.torch.samplers",
    "dpcore.torch.training",
    "audits.blackbox.opacus_training",  # by name: Opacus is imported by the runs that use it
)


def store() -> RunStore:
    """The audit's run store (``audits/results/runs/blackbox_one_run``)."""
    return run_store("blackbox_one_run", *SOURCES)


def audit(
    setting: OneRunSetting,
    epsilon: float,
    seed: int = 0,
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
    run_store: RunStore | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """One result row: train (or read) one run of (setting, epsilon, seed) and decide.

    Raises:
        InvalidParameterError: a bad setting, claim or seed (before the run).
        RunsFailedError: the run still failed after a retry.
    """
    start = time.perf_counter()
    spec = check_spec(OneRunSpec(setting, float(epsilon), seed))
    (result,) = run_many(execute, [spec], executor=executor, store=run_store, progress=progress)
    return _row(spec, result, time.perf_counter() - start)


def _row(spec: OneRunSpec, result: dict[str, Any], wall: float) -> dict[str, Any]:
    setting, base = spec.setting, spec.setting.base
    full_batch = base.sampling_probability == 1.0
    decision = decide(
        result["scores"],
        result["bits"],
        guesses_each_side=setting.guesses_each_side,
        delta=base.delta,
        gdp=full_batch,
    )
    return {
        "audit": "blackbox_one_run",
        "setting_name": setting.name,
        "setting": dataclasses.asdict(setting),
        "design": setting.design,
        "epsilon": spec.epsilon,
        "delta": base.delta,
        "seed": spec.seed,
        "noise_multiplier": float(result["noise_multiplier"]),
        "included": int(np.sum(result["bits"])),
        **decision,
        "run_seconds": float(result["seconds"]),
        "wall_seconds": wall,
    }


@dataclasses.dataclass(frozen=True)
class Profile:
    """Settings audited at each of ``epsilons`` with run seeds ``0..seeds-1``; ``fewer_seeds``
    gives some settings (by name) fewer (their runs cost more)."""

    name: str
    settings: tuple[OneRunSetting, ...]
    epsilons: tuple[float, ...]
    seeds: int = 1
    fewer_seeds: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        for setting in self.settings:
            check_setting(setting)
        check_count("seeds", self.seeds, minimum=1)
        names = {setting.name for setting in self.settings}
        for name, seeds in self.fewer_seeds:
            if name not in names:
                raise InvalidParameterError(
                    "fewer_seeds", f"setting names in {sorted(names)}", name
                )
            check_count("seeds", seeds, minimum=1)

    def seeds_of(self, setting: OneRunSetting) -> int:
        """How many run seeds ``setting`` is audited with."""
        return dict(self.fewer_seeds).get(setting.name, self.seeds)


_FULL_BATCH = BlackBoxSetting(name="worst-case init, full batch", seed=1)
_POISSON = dataclasses.replace(
    _FULL_BATCH, name="worst-case init, q = 0.1", sampling_probability=0.1, steps=100, lr=0.1
)


#: The same training by Opacus 1.6, on the MNIST CNN, and on the whole training split (random
#: init: no records are left to pre-train on), as in the multi-run audit's profile.
_OPACUS = dataclasses.replace(_FULL_BATCH, implementation="opacus")
_CNN = dataclasses.replace(_FULL_BATCH, model="cnn")
_OPACUS_CNN = dataclasses.replace(_CNN, implementation="opacus")
_FULL_MNIST = dataclasses.replace(_FULL_BATCH, subset_size=60_000, init="random")
_OPACUS_FULL_MNIST = dataclasses.replace(_FULL_MNIST, implementation="opacus")


def _setting(
    design: str,
    labels: str,
    base: BlackBoxSetting = _FULL_BATCH,
    canaries: int = 1000,
    prefix: str = "",
) -> OneRunSetting:
    """m canaries of ``design``; k = m / 10 guesses on each side (chosen on pilot runs with run
    seeds 97-99, which no profile audits); ``prefix`` names the implementation, model or
    records where they are not the default (dpcore, linear, the 1,000-record subset)."""
    batch = "full batch" if base.sampling_probability == 1 else f"q = {base.sampling_probability}"
    name = f"{prefix}{design}, {labels.replace('_', '-')} labels, {batch}"
    if canaries > 1000:
        name += f", {canaries} canaries"
    return OneRunSetting(name, design, labels, canaries, canaries // 10, base=base)


PROFILES = {
    "quick": Profile(
        "quick",
        (_setting("orthogonal", "least_likely", canaries=784), _setting("dense", "random")),
        (4.0, 10.0),
        seeds=3,
    ),
    "full": Profile(
        "full",
        (
            _setting("orthogonal", "least_likely", canaries=784),
            _setting("dense", "least_likely"),
            _setting("dense", "least_likely", canaries=5000),
            _setting("dense", "random"),
            _setting("sparse", "random"),
            _setting("orthogonal", "least_likely", _POISSON, canaries=784),
            _setting("dense", "least_likely", _OPACUS, prefix="Opacus: "),
            _setting("dense", "least_likely", _CNN, prefix="CNN: "),
            _setting("dense", "least_likely", _OPACUS_CNN, prefix="Opacus CNN: "),
            _setting("dense", "least_likely", _FULL_MNIST, prefix="60,000 records: "),
            _setting(
                "dense", "least_likely", _OPACUS_FULL_MNIST, prefix="Opacus, 60,000 records: "
            ),
        ),
        (1.0, 2.0, 4.0, 8.0, 10.0),
        seeds=20,
        # seconds of one thread per run (Xeon, 2 CPUs): Opacus CNN ~25, 60,000 records ~15
        # (Opacus ~150), against ~1 for the linear model on 1,000 records
        fewer_seeds=(
            ("Opacus CNN: dense, least-likely labels, full batch", 10),
            ("60,000 records: dense, least-likely labels, full batch", 10),
            ("Opacus, 60,000 records: dense, least-likely labels, full batch", 2),
        ),
    ),
}


def results_name(profile: str) -> str:
    """``blackbox_one_run`` for the full profile, ``blackbox_one_run_<profile>`` else."""
    return "blackbox_one_run" if profile == "full" else f"blackbox_one_run_{profile}"


def run(
    profile: str = "quick",
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
    chosen: Profile | None = None,
    setting_names: Sequence[str] | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Audit every (setting, claim, seed) of a profile through :func:`run_many` (one call per
    setting) into the run store, and save the rows after every setting
    (``results/<results_name(profile)>.json``).

    Args:
        profile: "quick" or "full" (:data:`PROFILES`).
        executor: where the runs go (see :func:`dpcore.runs.run_many`).
        chosen: a profile to run instead of the named one (tests, partial measurements).
        setting_names: audit only the settings whose names contain one of these texts; their
            rows replace the saved rows of the same (setting, claim, seed), the others stay
            (each keeps the commit it was measured at).
        progress: show progress bars.

    Returns:
        The rows audited by this call.

    Raises:
        InvalidParameterError: an unknown profile name or setting (before any run).
        RunsFailedError: runs still failed after a retry.
    """
    if chosen is None and profile not in PROFILES:
        raise InvalidParameterError("profile", f"in {sorted(PROFILES)}", profile)
    plan = chosen if chosen is not None else PROFILES[profile]
    keep = chosen_names([setting.name for setting in plan.settings], setting_names, plan.name)
    start = time.perf_counter()
    stem = results_name(plan.name)
    previous, meta = previous_rows(stem, setting_names)
    stamp = results_io.stamp()
    config = {
        "profile": plan.name,
        "settings": [dataclasses.asdict(setting) for setting in plan.settings],
        "epsilons": list(plan.epsilons),
        "seeds": plan.seeds,
        "fewer_seeds": [list(entry) for entry in plan.fewer_seeds],
        "confidence": CONFIDENCE,
        "executor": str(executor) if executor is not None else "local",
        "hardware": {k: v for k, v in machine().items() if k != "host"},
        "torch": sys.modules["torch"].__version__,
        "anchors": list(ANCHORS),
    }
    kept = store()
    rows: list[dict[str, Any]] = []
    for setting, wanted in zip(plan.settings, keep, strict=True):
        if not wanted:
            continue
        specs = [
            check_spec(OneRunSpec(setting, float(epsilon), seed))
            for epsilon in plan.epsilons
            for seed in range(plan.seeds_of(setting))
        ]
        results = run_many(execute, specs, executor=executor, store=kept, progress=progress)
        rows += [
            {
                **_row(spec, result, float(result["seconds"])),
                "profile": plan.name,
                "commit": stamp["commit"],
                "created": stamp["created"],
            }
            for spec, result in zip(specs, results, strict=True)
        ]
        config["wall_seconds"] = time.perf_counter() - start
        together = merged(previous, meta, rows, key=("setting_name", "epsilon", "seed"))
        save(stem, in_profile_order(together, [s.name for s in plan.settings]), config)
    return rows
