"""Command line: ``python -m dpcore account ...`` and ``python -m dpcore calibrate ...``.

``account`` composes the DP-SGD event (Poisson sampling rate q, noise multiplier sigma, T steps)
in every accountant and prints epsilon at the given delta, its direction and the time it took.
``--json`` prints a list of objects ``{accountant, epsilon, epsilon_lower, kind, seconds}``
(``epsilon_lower`` only where an accountant certifies one; an infinite epsilon is ``null``).
Bad input exits with status 2 and one line on stderr.

``--sampler`` says how the lots were drawn: ``poisson`` (default; rate q), ``balls-in-bins``
(each record in exactly one of the 1/q steps of every epoch, analysed as random allocation) or
``shuffle`` (fixed batches of B = q N from a fresh shuffle per epoch, which needs
``--dataset-size N``): no accountant bounds shuffling from above, so the Poisson rows are
marked as not valid for it and a last row ``shuffle`` gives a certified *lower* bound.

The run is given as ``--sampling-rate q --steps T`` or, as Opacus users think of it, as
``--batch-size B --dataset-size N --epochs E``: then q = B / N and T = E round(N / B) (the lots
per epoch of :class:`~dpcore.torch.samplers.PoissonSampler`), and both are shown with the result.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from dpcore.accountants import ACCOUNTANT_NAMES, accountant_class
from dpcore.accountants.base import EstimateKind
from dpcore.accountants.pld import PldAccountant
from dpcore.accountants.shuffled import shuffled_lower_bound
from dpcore.calibration import DEFAULT_ACCOUNTANT, calibrate_noise
from dpcore.errors import DPCoreError, InvalidParameterError
from dpcore.events import (
    DpEvent,
    GaussianEvent,
    JLGaussianEvent,
    PoissonSampledEvent,
    RandomAllocationEvent,
    SelfComposedEvent,
    dpsgd_event,
)
from dpcore.validation import check_count, check_delta_closed, check_epsilon

__all__ = ["SAMPLERS", "main"]

#: Values of ``--sampler``.
SAMPLERS = ("poisson", "balls-in-bins", "shuffle")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"dpcore: error: {message}\n")


def _parsed(name: str, convert: Callable[[str], Any], constraint: str) -> Callable[[str], Any]:
    """An argparse type that reports failures in dpcore's "Expected ..." form."""

    def parse(text: str) -> Any:
        try:
            return convert(text)
        except ValueError:
            message = str(InvalidParameterError(name, constraint, text))
            raise argparse.ArgumentTypeError(message) from None

    return parse


def _real(name: str) -> Callable[[str], Any]:
    return _parsed(name, float, "to be a real number")


def _integer(name: str) -> Callable[[str], Any]:
    return _parsed(name, int, "to be an integer >= 0")


def _accountant_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if name == "prv":
            raise argparse.ArgumentTypeError(
                str(
                    InvalidParameterError(
                        "accountants",
                        f"in {ACCOUNTANT_NAMES}; for Opacus' prv (an estimate of the privacy "
                        "loss distribution) use pld: the same distribution with certified "
                        "upper and lower bounds",
                        name,
                    )
                )
            )
        if name not in ACCOUNTANT_NAMES:
            raise argparse.ArgumentTypeError(
                str(InvalidParameterError("accountants", f"in {ACCOUNTANT_NAMES}", name))
            )
    if not names:
        raise argparse.ArgumentTypeError("Expected at least one accountant name, got ''.")
    return names


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m dpcore", description="Differential privacy accounting.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add_common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--sampling-rate",
            type=_real("sampling_rate"),
            default=None,
            help="Poisson sampling probability q in [0, 1] (or --batch-size and --dataset-size)",
        )
        sub.add_argument(
            "--steps",
            type=_integer("steps"),
            default=None,
            help="number of noisy steps T >= 0 (or --epochs with --batch-size, --dataset-size)",
        )
        sub.add_argument(
            "--batch-size",
            type=_integer("batch_size"),
            default=None,
            help="expected lot size B: q = B / N (with --dataset-size)",
        )
        sub.add_argument(
            "--epochs",
            type=_integer("epochs"),
            default=None,
            help="epochs E: T = E round(N / B) (with --batch-size and --dataset-size)",
        )
        sub.add_argument(
            "--dataset-size",
            type=_integer("dataset_size"),
            default=None,
            help="N, the number of records (for --batch-size, and --sampler shuffle)",
        )
        sub.add_argument(
            "--delta",
            type=_real("delta"),
            required=True,
            help="target delta in [0, 1) (0: pure DP, finite only for pure-DP steps)",
        )
        sub.add_argument("--json", action="store_true", help="print JSON instead of a table")

    account = commands.add_parser("account", help="epsilon of DP-SGD under every accountant")
    add_common(account)
    account.add_argument(
        "--noise-multiplier",
        type=_real("noise_multiplier"),
        required=True,
        help="noise standard deviation over the clipping norm, sigma >= 0",
    )
    account.add_argument(
        "--jl-dimension",
        type=_integer("jl_dimension"),
        default=None,
        help="also account DP-SGD-JL with r random projections (adds the 'jl' row)",
    )
    account.add_argument(
        "--sampler",
        choices=SAMPLERS,
        default="poisson",
        help="how lots were drawn: poisson (rate q), balls-in-bins (1/q steps per epoch, each "
        "record in one), shuffle (batches of q N per shuffled epoch; gives a lower bound)",
    )
    account.add_argument(
        "--accountants",
        type=_accountant_list,
        default=list(ACCOUNTANT_NAMES),
        help=f"comma-separated subset of {','.join(ACCOUNTANT_NAMES)}",
    )

    calibrate = commands.add_parser("calibrate", help="smallest sigma meeting a target epsilon")
    add_common(calibrate)
    calibrate.add_argument("--target-epsilon", type=_real("target_epsilon"), required=True)
    calibrate.add_argument("--accountant", choices=ACCOUNTANT_NAMES, default=DEFAULT_ACCOUNTANT)
    return parser


def run_shape(
    *,
    sampling_rate: float | None,
    steps: int | None,
    batch_size: int | None,
    dataset_size: int | None,
    epochs: int | None,
) -> tuple[float, int, str]:
    """(q, T, how they were derived) from ``--sampling-rate``/``--steps`` or B, N and epochs.

    q = B / N when ``--sampling-rate`` is not given; T = epochs round(N / B) when ``--steps``
    is not given (the lots per epoch of a Poisson sampler at that rate).

    Raises:
        InvalidParameterError: a quantity given both ways, or missing both ways, or a B, N or
            epochs out of range (B in [1, N], N >= 1, epochs >= 1).
    """
    notes = []
    if sampling_rate is not None and batch_size is not None:
        raise InvalidParameterError(
            "batch_size", "not given with --sampling-rate (q = B / N)", batch_size
        )
    if steps is not None and epochs is not None:
        raise InvalidParameterError("epochs", "not given with --steps (T = epochs N / B)", epochs)
    rate = sampling_rate
    if rate is None:
        if batch_size is None or dataset_size is None:
            raise InvalidParameterError(
                "sampling_rate",
                "given (--sampling-rate q), or derived from --batch-size B and --dataset-size N",
                None,
            )
        n = check_count("dataset_size", dataset_size, minimum=1)
        b = check_count("batch_size", batch_size, minimum=1)
        if b > n:
            raise InvalidParameterError("batch_size", f"in [1, dataset_size = {n}]", b)
        rate = b / n
        notes.append(f"q = B / N = {b} / {n} = {rate:.6g}")
    count = steps
    if count is None:
        if epochs is None:
            raise InvalidParameterError(
                "steps", "given (--steps T), or derived from --epochs with --batch-size", None
            )
        lots = 1 / rate if rate > 0 else math.inf
        if not math.isfinite(lots) or lots >= sys.maxsize:
            raise InvalidParameterError(
                "sampling_rate", "> 0 to count lots per epoch (--epochs)", rate
            )
        per_epoch = max(1, round(lots))
        count = check_count("epochs", epochs, minimum=1) * per_epoch
        notes.append(f"T = epochs x round(N / B) = {epochs} x {per_epoch} = {count}")
    return rate, count, "; ".join(notes)


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else float(value)


def account_rows(
    *,
    sampling_rate: float,
    noise_multiplier: float,
    steps: int,
    delta: float,
    accountants: Sequence[str] = ACCOUNTANT_NAMES,
    jl_dimension: int | None = None,
    sampler: str = "poisson",
    dataset_size: int | None = None,
) -> list[dict[str, Any]]:
    """One result object per accountant, as printed by ``account --json``.

    With ``jl_dimension`` a last row ``jl`` gives the certified interval for DP-SGD-JL with that
    many projections (Bu et al. 2021), the same steps otherwise. ``sampler`` is one of
    :data:`SAMPLERS` (see the module docstring); an accountant that cannot analyse the sampler's
    event gets a row with its reason under ``unsupported`` and no epsilon.
    """
    if sampler not in SAMPLERS:
        raise InvalidParameterError("sampler", f"in {SAMPLERS}", sampler)
    if jl_dimension is not None and sampler != "poisson":
        raise InvalidParameterError(
            "jl_dimension", "to be unset except with the poisson sampler", jl_dimension
        )
    event: DpEvent = dpsgd_event(
        sampling_probability=sampling_rate, noise_multiplier=noise_multiplier, steps=steps
    )
    delta = check_delta_closed("delta", delta)
    if sampler == "balls-in-bins":
        event = _balls_in_bins_event(sampling_rate, noise_multiplier, steps)
    lower = None
    if sampler == "shuffle":
        lower = _shuffle_row(sampling_rate, noise_multiplier, steps, delta, dataset_size)
    runs: list[tuple[str, DpEvent]] = [(name, event) for name in accountants]
    if jl_dimension is not None:
        step = PoissonSampledEvent(
            sampling_rate,
            JLGaussianEvent(noise_multiplier, check_count("jl_dimension", jl_dimension, minimum=1)),
        )
        runs.append(("jl", SelfComposedEvent(step, steps)))
    rows: list[dict[str, Any]] = []
    for name, run_event in runs:
        start = time.perf_counter()
        accountant = accountant_class(name)()
        reason = accountant.unsupported_reason(run_event)
        if reason is not None:
            if sampler != "poisson":  # say why instead of leaving the accountant out
                rows.append(
                    {
                        "accountant": name,
                        "kind": accountant.kind.value,
                        "epsilon": None,
                        "unsupported": reason,
                        "seconds": 0.0,
                    }
                )
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            accountant.compose(run_event)
            row: dict[str, Any] = {"accountant": name, "kind": accountant.kind.value}
            if isinstance(accountant, PldAccountant):
                interval = accountant.get_epsilon_interval(delta)
                row["epsilon"] = _finite(interval.upper)
                row["epsilon_lower"] = _finite(interval.lower)
            else:
                row["epsilon"] = _finite(accountant.get_epsilon(delta))
        row["seconds"] = time.perf_counter() - start
        if caught:
            row["notes"] = [str(item.message) for item in caught]
        if sampler == "shuffle":  # the number is Poisson's; it bounds nothing here
            row["valid"] = False
        rows.append(row)
    _flag_clt_understatement(rows)
    if lower is not None:
        rows.append(lower)
    return rows


def _balls_in_bins_event(rate: float, sigma: float, steps: int) -> DpEvent:
    """Started epochs of random allocation over 1/q steps (a partial epoch costs a full one)."""
    per_epoch = round(1 / rate) if rate > 0 else 0
    if per_epoch < 1 or abs(per_epoch * rate - 1) > 1e-9:
        raise InvalidParameterError(
            "sampling_rate",
            "to be 1 / T for an integer T (steps per epoch) with balls-in-bins",
            rate,
        )
    step = RandomAllocationEvent(per_epoch, GaussianEvent(sigma))
    return SelfComposedEvent(step, -(-check_count("steps", steps) // per_epoch))


def _shuffle_row(
    rate: float, sigma: float, steps: int, delta: float, dataset_size: int | None
) -> dict[str, Any]:
    """The certified lower bound on shuffled DP-SGD (:mod:`dpcore.accountants.shuffled`)."""
    if dataset_size is None:
        raise InvalidParameterError(
            "dataset_size", "to be given (an integer >= 1) with --sampler shuffle", None
        )
    n = check_count("dataset_size", dataset_size, minimum=1)
    batch = round(rate * n)
    if batch < 1 or abs(batch - rate * n) > 1e-9 * n:
        raise InvalidParameterError(
            "sampling_rate", f"to be B / N for an integer batch size B (N = {n})", rate
        )
    start = time.perf_counter()
    bound = shuffled_lower_bound(
        noise_multiplier=sigma, dataset_size=n, batch_size=batch, steps=steps
    )
    return {
        "accountant": "shuffle",
        "kind": "lower_bound",
        "epsilon": _finite(bound.epsilon(delta)),
        "seconds": time.perf_counter() - start,
        "notes": [
            "certified lower bound for shuffled batches (Chua et al. 2024): every valid "
            "epsilon of this run is at least this"
        ],
    }


def _flag_clt_understatement(rows: list[dict[str, Any]]) -> None:
    """Note on the CLT row when it lies below the certified PLD lower bound."""
    by_name = {row["accountant"]: row for row in rows}
    clt, pld = by_name.get("gdp_clt"), by_name.get("pld")
    if not clt or not pld or clt["epsilon"] is None or pld.get("epsilon_lower") is None:
        return
    if clt["epsilon"] < pld["epsilon_lower"]:
        clt.setdefault("notes", []).append(
            "the CLT approximation is below the certified PLD lower bound "
            f"({clt['epsilon']:.4g} < {pld['epsilon_lower']:.4g}): "
            "it understates the privacy loss here"
        )


def _format_table(rows: list[dict[str, Any]], delta: float) -> str:
    def number(value: float | None) -> str:
        return "inf" if value is None else f"{value:.4g}"

    lines = [f"{'accountant':<11} {'epsilon':>21}  {'direction':<29} {'seconds':>8}"]
    for row in rows:
        if "unsupported" in row:
            value, direction = "-", "cannot analyse this sampler"
        elif row.get("valid") is False:
            value, direction = number(row["epsilon"]), "Poisson's; not valid here"
        elif row["kind"] == "lower_bound":
            value, direction = number(row["epsilon"]), "certified lower bound"
        elif "epsilon_lower" in row:
            value = f"[{number(row['epsilon_lower'])}, {number(row['epsilon'])}]"
            direction = "interval (certified bounds)"
        elif row["kind"] == EstimateKind.APPROXIMATE.value:
            value, direction = number(row["epsilon"]), "approximate, not a guarantee"
        else:
            value, direction = number(row["epsilon"]), "upper bound"
        lines.append(f"{row['accountant']:<11} {value:>21}  {direction:<29} {row['seconds']:>8.3f}")
    lines.append(f"(epsilon at delta = {delta:g}; add/remove-one neighbouring)")
    if any(row.get("valid") is False for row in rows):
        lines.append(
            "(shuffled batches: the accountants' numbers assume Poisson sampling and bound "
            "nothing here; the shuffle row is a certified lower bound)"
        )
    for row in rows:
        for note in row.get("notes", []):
            lines.append(f"note ({row['accountant']}): {note}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = _build_parser().parse_args(argv)
    try:
        rate, steps, derived = run_shape(
            sampling_rate=args.sampling_rate,
            steps=args.steps,
            batch_size=args.batch_size,
            dataset_size=args.dataset_size,
            epochs=args.epochs,
        )
        if derived and not args.json:
            print(derived)
        if args.command == "account":
            rows = account_rows(
                sampling_rate=rate,
                noise_multiplier=args.noise_multiplier,
                steps=steps,
                delta=args.delta,
                accountants=args.accountants,
                jl_dimension=args.jl_dimension,
                sampler=args.sampler,
                dataset_size=args.dataset_size,
            )
            print(
                json.dumps(rows, allow_nan=False) if args.json else _format_table(rows, args.delta)
            )
        else:
            steps = check_count("steps", steps)
            target = check_epsilon("target_epsilon", args.target_epsilon)
            start = time.perf_counter()
            sigma = calibrate_noise(
                target_epsilon=target,
                target_delta=args.delta,
                sampling_probability=rate,
                steps=steps,
                accountant=args.accountant,
            )
            result = {
                "accountant": args.accountant,
                "sampling_rate": rate,
                "steps": steps,
                "noise_multiplier": sigma,
                "target_epsilon": target,
                "delta": args.delta,
                "seconds": time.perf_counter() - start,
            }
            if args.json:
                print(json.dumps(result, allow_nan=False))
            else:
                print(
                    f"noise multiplier {sigma:.6g} meets epsilon <= {target:g} at delta = "
                    f"{args.delta:g} under the {args.accountant} accountant "
                    f"({result['seconds']:.2f} s)"
                )
    except DPCoreError as error:
        print(f"dpcore: error: {error}", file=sys.stderr)
        return 2
    return 0
