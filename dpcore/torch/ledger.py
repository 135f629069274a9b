"""The torch trainer's privacy statement; the ledger itself is :mod:`dpcore.ledger`.

``PrivacyLedger``, ``SAMPLERS`` and ``write_statement`` are re-exported here, where the torch
modules have always imported them from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dpcore.calibration import DEFAULT_ACCOUNTANT
from dpcore.ledger import SAMPLERS, PrivacyLedger, write_statement

if TYPE_CHECKING:
    from dpcore.torch.optimizers import DPOptimizer

__all__ = ["SAMPLERS", "PrivacyLedger", "training_statement", "write_statement"]


def training_statement(
    ledger: PrivacyLedger,
    delta: float,
    accountants: tuple[str, ...],
    optimizer: DPOptimizer,
    sampler: Any,
    jl_dimension: int | None,
    /,
    **extra: Any,
) -> dict[str, Any]:
    """The ledger's statement with the engine, clipping norm, noise, sampling and JL dimension.

    The fixed arguments are positional, so that ``extra`` may hold any key (e.g. ``optimizer``).
    An engine carrying audit hooks (which may change the clipped sums) says so in the statement.
    ``default_accountant`` names the accountant whose epsilon the library prints for the run
    (``epsilon()``, the progress bar): the PLD accountant's certified upper bound.
    """
    hooks = len(getattr(optimizer.engine, "audit_hooks", ()))
    if hooks:
        extra = {**extra, "audit_hooks_installed": hooks}
    statement = ledger.statement(
        delta=delta,
        accountants=accountants,
        engine=optimizer.engine.name,
        max_grad_norm=optimizer.engine.max_grad_norm,
        noise_multiplier=optimizer.noise_multiplier,
        noise_source=optimizer.noise.name,
        expected_lot_size=sampler.expected_lot_size,
        sampling_probability=sampler.sampling_probability,
        jl_dimension=jl_dimension,
        **extra,
    )
    statement["default_accountant"] = DEFAULT_ACCOUNTANT
    return statement
