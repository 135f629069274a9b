"""Excess empirical risk and test error vs epsilon, and the lambda trade-off, on real data.

Methods: output perturbation (norm-Laplace, epsilon-DP; Gaussian, (epsilon, delta)-DP),
objective perturbation (epsilon-DP), DP-SGD at the Gaussian variant's (epsilon, delta), and the
non-private optimum, all for L2-regularised logistic regression. Excess risk is
J_lambda(w) - J_lambda(w*_lambda) on the training set; the bounds of :mod:`dpcore.erm.bounds`
(expected excess, exact constants) are saved beside the measurements.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from dpcore.erm import bounds
from dpcore.erm.losses import LogisticLoss
from dpcore.erm.objective import minimise, regularised_risk
from dpcore.erm.objective_perturbation import objective_perturbation
from dpcore.erm.objective_perturbation_gaussian import objective_perturbation_gaussian
from dpcore.erm.output_perturbation import output_perturbation
from dpcore.runs import run_many
from reproductions.common import profile_config
from reproductions.erm.data import LOADERS
from reproductions.erm.dpsgd import dpsgd_logistic
from reproductions.harness import Executor, Output, fanned_store, fanning_out, spread

STEM = "erm_excess_risk"
LOSS = LogisticLoss()
METHODS = (
    "output_laplace",
    "objective_laplace",
    "output_gaussian",
    "objective_gaussian",
    "dpsgd",
)
#: The methods of the lambda sweep.
SWEPT = ("output_laplace", "objective_laplace")


@dataclasses.dataclass(frozen=True)
class ErmConfig:
    """Sizes; the quick profile subsamples the training sets (labelled here)."""

    profile: str = "quick"
    datasets: tuple[str, ...] = ("adult", "fashion_mnist_0v6")
    max_train: int | None = 5000  # None = the whole training split
    epsilons: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0, 10.0)
    seeds: tuple[int, ...] = (0, 1)
    regularisation: float = 1e-3
    delta: float = 1e-6
    lambda_sweep: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1)
    lambda_sweep_epsilon: float = 1.0
    dpsgd_lot_size: int = 256
    dpsgd_epochs: int = 5
    dpsgd_lr: float = 4.0


PROFILES = {
    "quick": ErmConfig(),
    "full": ErmConfig(
        profile="full",
        max_train=None,
        epsilons=(0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
        seeds=(0, 1, 2, 3, 4),
        lambda_sweep=(1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0),
    ),
}


def _row(dataset: str, part: str, method: str, **values: float | int | None) -> dict[str, object]:
    row: dict[str, object] = {"dataset": dataset, "part": part, "method": method}
    for key in ("epsilon", "regularisation", "seed", "excess_risk", "test_error"):
        row[key] = values.get(key)
    return row


def _release(
    method: str,
    x: np.ndarray,
    y: np.ndarray,
    *,
    lam: float,
    eps: float,
    config: ErmConfig,
    seed: int,
) -> np.ndarray:
    rng = np.random.default_rng([seed, int(eps * 1000), int(lam * 1e6)])
    options = {"loss": LOSS, "regularisation": lam, "epsilon": eps, "rng": rng}
    if method == "output_laplace":
        return output_perturbation(x, y, **options).weights
    if method == "output_gaussian":
        return output_perturbation(x, y, delta=config.delta, **options).weights
    if method == "objective_laplace":
        return objective_perturbation(x, y, **options).weights
    if method == "objective_gaussian":
        return objective_perturbation_gaussian(x, y, delta=config.delta, **options).weights
    weights, _ = dpsgd_logistic(
        x,
        y,
        epsilon=eps,
        delta=config.delta,
        lot_size=config.dpsgd_lot_size,
        epochs=config.dpsgd_epochs,
        lr=config.dpsgd_lr,
        seed=seed,
    )
    return weights


#: The code the rows depend on: a change here computes them afresh in the run store.
CODE_MODULES = ("dpcore.erm", "reproductions.erm.data", "reproductions.erm.dpsgd", __name__)


@functools.lru_cache(maxsize=2)
def _prepared(name: str, config: ErmConfig) -> tuple[Any, ...]:
    """``(x, y, x_test, y_test, optima)`` of dataset ``name``: the training rows (subsampled as
    the profile says) and the non-private optimum and its risk per regularisation."""
    (x, y), (x_test, y_test) = LOADERS[name]()
    if config.max_train is not None and config.max_train < x.shape[0]:
        keep = np.random.default_rng(0).choice(x.shape[0], config.max_train, replace=False)
        x, y = x[keep], y[keep]
    optima = {}
    for lam in sorted({config.regularisation, *config.lambda_sweep}):
        w = minimise(x, y, loss=LOSS, regularisation=lam)
        optima[lam] = (w, regularised_risk(w, features=x, labels=y, loss=LOSS, regularisation=lam))
    return x, y, x_test, y_test, optima


def _measure(
    prepared: tuple[Any, ...], w: np.ndarray, lam: float, floor: float
) -> dict[str, float]:
    x, y, x_test, y_test, _ = prepared
    risk = regularised_risk(w, features=x, labels=y, loss=LOSS, regularisation=lam)
    error = float(np.mean(np.where(x_test @ w >= 0, 1.0, -1.0) != y_test))
    return {"excess_risk": max(risk - floor, 0.0), "test_error": error}


@dataclasses.dataclass(frozen=True)
class SeedRun:
    """The private releases of one dataset at one seed: a spec for :func:`seed_rows`."""

    config: ErmConfig
    dataset: str
    seed: int


def seed_rows(run: SeedRun) -> dict[str, list[dict[str, object]]]:
    """Every release of ``run``'s dataset and seed, measured: ``epsilon`` (each epsilon, then
    each of :data:`METHODS`, at the profile's regularisation) and ``lambda`` (each
    regularisation of the sweep, then output and objective perturbation, at its epsilon).

    Each release draws from its own generator (seeded by seed, epsilon and lambda), so the
    seeds are independent runs.
    """
    config, name, seed = run.config, run.dataset, run.seed
    prepared = _prepared(name, config)
    x, y, optima = prepared[0], prepared[1], prepared[4]
    lam = config.regularisation
    by_epsilon = []
    for eps in config.epsilons:
        for method in METHODS:
            w = _release(method, x, y, lam=lam, eps=eps, config=config, seed=seed)
            measured = _measure(prepared, w, lam, optima[lam][1])
            by_epsilon.append(
                _row(
                    name, "epsilon", method, epsilon=eps, regularisation=lam, seed=seed, **measured
                )
            )
    eps = config.lambda_sweep_epsilon
    by_lambda = []
    for lam in config.lambda_sweep:
        for method in SWEPT:
            w = _release(method, x, y, lam=lam, eps=eps, config=config, seed=seed)
            measured = _measure(prepared, w, lam, optima[lam][1])
            by_lambda.append(
                _row(name, "lambda", method, epsilon=eps, regularisation=lam, seed=seed, **measured)
            )
    return {"epsilon": by_epsilon, "lambda": by_lambda}


def _dataset_rows(
    name: str, config: ErmConfig, seeds: dict[int, dict[str, list[dict[str, object]]]]
) -> list[dict[str, object]]:
    """The dataset's rows: its size, the non-private optima, the bounds and ``seeds``' releases
    (:func:`seed_rows` per seed), epsilon by epsilon and lambda by lambda."""
    prepared = _prepared(name, config)
    x, optima = prepared[0], prepared[4]
    n, d = x.shape
    rows = [_row(name, "info", "size", epsilon=None, regularisation=None, seed=n, excess_risk=d)]
    for lam, (w, floor) in sorted(optima.items()):
        rows.append(
            _row(
                name,
                "lambda",
                "non_private",
                regularisation=lam,
                **_measure(prepared, w, lam, floor),
            )
        )
    lam = config.regularisation
    w_star, floor = optima[lam]
    rows.append(
        _row(
            name,
            "epsilon",
            "non_private",
            regularisation=lam,
            **_measure(prepared, w_star, lam, floor),
        )
    )
    common = {"n": n, "dimension": d, "regularisation": lam, "smoothness": LOSS.smoothness}
    width = len(METHODS)
    for index, eps in enumerate(config.epsilons):
        for method, value in (
            ("bound_output_laplace", bounds.output_perturbation_excess_risk(epsilon=eps, **common)),
            (
                "bound_output_gaussian",
                bounds.output_perturbation_excess_risk(epsilon=eps, delta=config.delta, **common),
            ),
            (
                "bound_objective_laplace",
                bounds.objective_perturbation_excess_risk(
                    epsilon=eps, optimum_norm=float(np.linalg.norm(w_star)), **common
                ),
            ),
        ):
            rows.append(
                _row(name, "epsilon", method, epsilon=eps, regularisation=lam, excess_risk=value)
            )
        for seed in config.seeds:
            rows += seeds[seed]["epsilon"][index * width : (index + 1) * width]
    width = len(SWEPT)
    for index in range(len(config.lambda_sweep)):
        for seed in config.seeds:
            rows += seeds[seed]["lambda"][index * width : (index + 1) * width]
    return rows


def compute(
    profile: str = "quick",
    *,
    config: ErmConfig | None = None,
    output: Output | None = None,
    executor: Executor = None,
) -> None:
    """Run every dataset; save rows (measurements, bounds, sizes) to ``output`` (default:
    figures/).

    The releases of each dataset and seed (:class:`SeedRun`, independent) run through
    :func:`dpcore.runs.run_many`: here, one after another (``executor`` None or ``"local"``),
    or at once on ``executor``, their rows then kept in the run store (``<runs>/<STEM>``, keyed
    by :data:`CODE_MODULES`), where a later run reads them back.

    Raises:
        InvalidParameterError: the profile or ``executor`` is invalid (before anything runs).
        RunsFailedError: runs still failed after one retry.
    """
    config = profile_config(PROFILES, profile, config)
    fanned = fanning_out(executor)
    output = output or Output()
    store = fanned_store(fanned, output, STEM, *CODE_MODULES)
    runs = [SeedRun(config, name, seed) for name in config.datasets for seed in config.seeds]
    released = run_many(seed_rows, runs, executor=fanned, store=store)
    by_run = dict(zip(runs, released, strict=True))
    rows = [
        row
        for name in config.datasets
        for row in _dataset_rows(
            name, config, {seed: by_run[SeedRun(config, name, seed)] for seed in config.seeds}
        )
    ]
    output.save_results(STEM, config=config, rows=rows, extra={"runs_spread": spread(fanned)})


STYLES = {
    "output_laplace": ("output pert. (eps-DP)", "tab:red"),
    "objective_laplace": ("objective pert. (eps-DP)", "tab:blue"),
    "output_gaussian": ("output pert. Gaussian (eps, delta)", "tab:orange"),
    "objective_gaussian": ("objective pert. Gaussian (eps, delta), KST", "tab:cyan"),
    "dpsgd": ("DP-SGD (eps, delta), RDP", "tab:purple"),
}


def _mean_by(
    rows: list[dict[str, object]], key: str, value: str
) -> tuple[list[float], list[float]]:
    grouped: dict[float, list[float]] = {}
    for row in rows:
        grouped.setdefault(float(row[key]), []).append(float(row[value]))  # type: ignore[arg-type]
    xs = sorted(grouped)
    return xs, [float(np.mean(grouped[x])) for x in xs]


def plot(*, output: Output | None = None) -> None:
    """Draw ``erm_excess_risk.png`` from the results saved in ``output`` (default: figures/)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output = output or Output()
    data = output.load_results(STEM)
    rows, config = data["rows"], data["config"]
    names = config["datasets"]
    figure, axes = plt.subplots(len(names), 3, figsize=(15, 4.2 * len(names)), squeeze=False)
    for line, name in zip(axes, names, strict=True):
        mine = [r for r in rows if r["dataset"] == name]
        size = next(r for r in mine if r["part"] == "info")
        by_eps = [r for r in mine if r["part"] == "epsilon"]
        tag = f"{name} (n={size['seed']}, d={size['excess_risk']}, "
        tag += f"lambda={config['regularisation']:g})"
        for method, (label, colour) in STYLES.items():
            chosen = [r for r in by_eps if r["method"] == method]
            eps, risk = _mean_by(chosen, "epsilon", "excess_risk")
            line[0].plot(eps, risk, "o-", color=colour, label=label)
            eps, error = _mean_by(chosen, "epsilon", "test_error")
            line[1].plot(eps, error, "o-", color=colour, label=label)
            bound = [r for r in by_eps if r["method"] == f"bound_{method}"]
            if bound:
                eps, value = _mean_by(bound, "epsilon", "excess_risk")
                line[0].plot(eps, value, "--", color=colour, label=f"bound: {label}")
        best = next(r for r in by_eps if r["method"] == "non_private")
        line[1].axhline(best["test_error"], color="black", label="non-private optimum")
        line[0].set(xscale="log", yscale="log", xlabel="epsilon", ylabel="excess empirical risk")
        line[1].set(xscale="log", xlabel="epsilon", ylabel="test error")
        line[0].set_title(tag, fontsize=9)
        by_lam = [r for r in mine if r["part"] == "lambda"]
        for method in ("output_laplace", "objective_laplace", "non_private"):
            label, colour = STYLES.get(method, ("non-private optimum (bias only)", "black"))
            lam, error = _mean_by(
                [r for r in by_lam if r["method"] == method], "regularisation", "test_error"
            )
            line[2].plot(lam, error, "o-", color=colour, label=label)
        line[2].set(
            xscale="log",
            xlabel="lambda",
            ylabel="test error",
            title=f"lambda trade-off at eps = {config['lambda_sweep_epsilon']:g}",
        )
        for axis in line:
            axis.grid(alpha=0.3)
            axis.legend(fontsize=6)
    subsample = (
        ""
        if config["max_train"] is None
        else f", training sets subsampled to {config['max_train']}"
    )
    figure.suptitle(
        f"Private ERM, profile {config['profile']}{subsample}, "
        f"{len(config['seeds'])} seeds, delta = {config['delta']:g}"
    )
    figure.tight_layout()
    figure.savefig(output.path(f"{STEM}.png"), dpi=120)
    plt.close(figure)
