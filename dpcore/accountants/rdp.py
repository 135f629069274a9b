"""The Rényi-DP accountant (Mironov 2017): RDP curves add over steps, converted at query time."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpcore.accountants.base import NeighboringRelation, PrivacyAccountant, handles
from dpcore.accountants.rdp_math import (
    delta_from_rdp,
    epsilon_from_rdp,
    laplace_rdp,
    pure_dp_rdp,
    sampled_without_replacement_gaussian_rdp,
    subsampled_gaussian_rdp,
)
from dpcore.errors import InvalidParameterError
from dpcore.events import (
    DpEvent,
    EpsilonDeltaEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
)

__all__ = ["DEFAULT_ORDERS", "OrderGridEdgeWarning", "RdpAccountant"]

#: The order grid of Google's dp_accounting (so that answers can be compared order by order).
DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [1 + x / 10.0 for x in range(1, 100)]
    + [float(x) for x in range(11, 64)]
    + [128.0, 256.0, 512.0, 1024.0]
)


class OrderGridEdgeWarning(UserWarning):
    """The optimal RDP order is the smallest or largest of the grid: a wider grid may help."""


class RdpAccountant(PrivacyAccountant):
    """Rényi-DP accountant over a fixed grid of orders.

    Supports Gaussian, Laplace and pure epsilon-DP steps, Poisson-subsampled Gaussians under
    add/remove-one neighbouring, and Gaussians on fixed-size samples drawn without replacement
    under replace-one neighbouring (the relation that analysis needs).

    Args:
        orders: RDP orders > 1 (default :data:`DEFAULT_ORDERS`).
        neighboring_relation: ``add_or_remove_one`` (default) or ``replace_one``.

    Example:
        >>> from dpcore.events import dpsgd_event
        >>> acc = RdpAccountant().compose(
        ...     dpsgd_event(sampling_probability=0.01, noise_multiplier=1.0, steps=1000))
        >>> round(acc.get_epsilon(1e-5), 4)
        2.1014
    """

    name = "rdp"

    def __init__(
        self,
        orders: Sequence[float] | None = None,
        neighboring_relation: NeighboringRelation | str = NeighboringRelation.ADD_OR_REMOVE_ONE,
    ) -> None:
        super().__init__()
        grid = DEFAULT_ORDERS if orders is None else orders
        if isinstance(grid, (str, bytes)) or not isinstance(grid, Sequence) or len(grid) == 0:
            raise InvalidParameterError(
                "orders", "to be a non-empty sequence of numbers > 1", orders
            )
        values = []
        for order in grid:
            if isinstance(order, bool) or not isinstance(order, (int, float)) or not order > 1:
                raise InvalidParameterError("orders", "to contain only numbers > 1", order)
            if math.isnan(order):
                raise InvalidParameterError("orders", "to contain only numbers > 1", order)
            values.append(float(order))
        self._orders = np.array(sorted(set(values)))
        try:
            self._relation = NeighboringRelation(neighboring_relation)
        except ValueError:
            choices = [r.value for r in NeighboringRelation]
            raise InvalidParameterError(
                "neighboring_relation", f"in {choices}", neighboring_relation
            ) from None
        self._rdp = np.zeros_like(self._orders)

    @property
    def orders(self) -> np.ndarray:
        """The order grid (sorted, read-only copy)."""
        return self._orders.copy()

    @property
    def rdp(self) -> np.ndarray:
        """The accumulated RDP at each order."""
        return self._rdp.copy()

    def config(self) -> dict[str, Any]:
        return {
            "orders": [float(o) for o in self._orders],
            "neighboring_relation": self._relation.value,
        }

    def _leaf_reason(self, event: DpEvent) -> str | None:
        poisson = isinstance(event, PoissonSampledEvent)
        without = isinstance(event, SampledWithoutReplacementEvent)
        if without and self._relation is not NeighboringRelation.REPLACE_ONE:
            return "sampling without replacement is analysed under replace_one neighbouring only"
        if poisson and self._relation is not NeighboringRelation.ADD_OR_REMOVE_ONE:
            return "Poisson sampling is analysed under add_or_remove_one neighbouring only"
        if isinstance(event, EpsilonDeltaEvent) and event.delta > 0:
            return "an (epsilon, delta) event with delta > 0 has no RDP curve"
        return None

    @handles((GaussianEvent,))
    def _gaussian(self, event: GaussianEvent, count: int) -> None:
        self._add(
            count,
            subsampled_gaussian_rdp(
                sampling_probability=1.0,
                noise_multiplier=event.noise_multiplier,
                orders=self._orders,
            ),
        )

    @handles((PoissonSampledEvent, GaussianEvent))
    def _poisson_gaussian(self, event: PoissonSampledEvent, count: int) -> None:
        inner = event.event
        assert isinstance(inner, GaussianEvent)  # guaranteed by the registry signature
        self._add(
            count,
            subsampled_gaussian_rdp(
                sampling_probability=event.sampling_probability,
                noise_multiplier=inner.noise_multiplier,
                orders=self._orders,
            ),
        )

    @handles((SampledWithoutReplacementEvent, GaussianEvent))
    def _without_replacement_gaussian(
        self, event: SampledWithoutReplacementEvent, count: int
    ) -> None:
        inner = event.event
        assert isinstance(inner, GaussianEvent)
        self._add(
            count,
            sampled_without_replacement_gaussian_rdp(
                sample_size=event.sample_size,
                dataset_size=event.dataset_size,
                noise_multiplier=inner.noise_multiplier,
                orders=self._orders,
            ),
        )

    @handles((LaplaceEvent,))
    def _laplace(self, event: LaplaceEvent, count: int) -> None:
        self._add(count, laplace_rdp(noise_multiplier=event.noise_multiplier, orders=self._orders))

    @handles((EpsilonDeltaEvent,))
    def _pure(self, event: EpsilonDeltaEvent, count: int) -> None:
        self._add(count, pure_dp_rdp(epsilon=event.epsilon, orders=self._orders))

    def _add(self, count: int, rdp: np.ndarray) -> None:
        with np.errstate(invalid="ignore"):
            step = np.where(rdp == 0, 0.0, count * rdp)  # 0 * inf stays 0 only for zero RDP
        self._rdp = self._rdp + step

    def _check_edge(self, order: float, what: str) -> None:
        if (
            len(self._orders) > 1
            and order in (self._orders[0], self._orders[-1])
            and any(self._rdp > 0)
        ):
            side = "smallest" if order == self._orders[0] else "largest"
            warnings.warn(
                f"The optimal RDP order for this {what} is {order:g}, the {side} of the grid "
                f"[{self._orders[0]:g}, {self._orders[-1]:g}]; extend the grid (orders=...) "
                "for a possibly smaller bound.",
                OrderGridEdgeWarning,
                stacklevel=4,
            )

    def get_epsilon_and_order(self, target_delta: float) -> tuple[float, float]:
        """(epsilon, the RDP order that attains it)."""
        epsilon = self.get_epsilon(target_delta)
        _, order = epsilon_from_rdp(orders=self._orders, rdp=self._rdp, delta=target_delta)
        return epsilon, order

    def _epsilon(self, delta: float) -> float:
        if not np.any(self._rdp > 0):
            return 0.0
        epsilon, order = epsilon_from_rdp(orders=self._orders, rdp=self._rdp, delta=delta)
        if math.isfinite(epsilon) and epsilon > 0:
            self._check_edge(order, "epsilon")
        return epsilon

    def _delta(self, epsilon: float) -> float:
        if not np.any(self._rdp > 0):
            return 0.0
        delta, order = delta_from_rdp(orders=self._orders, rdp=self._rdp, epsilon=epsilon)
        if 0 < delta < 1:
            self._check_edge(order, "delta")
        return delta
