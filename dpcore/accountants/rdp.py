"""The Rényi-DP accountant (Mironov 2017): RDP curves add over steps, converted at query time.

Alongside the RDP curve the accountant keeps the sum of the steps' pure-DP epsilons (their
Rényi divergence of order inf, Mironov 2017, Def. 3 and Prop. 3; inf for Gaussian steps), so
that ``get_epsilon(0)`` is that sum -- finite only when every step is pure DP (Laplace, pure
(epsilon, 0), randomized response, exponential mechanism) -- and ``get_epsilon(delta)`` never
exceeds it (pure epsilon-DP is (epsilon, delta)-DP for every delta).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpcore.accountants.base import NeighboringRelation, PrivacyAccountant, handles
from dpcore.accountants.basic import randomized_response_epsilon
from dpcore.accountants.random_allocation_math import random_allocation_gaussian_rdp
from dpcore.accountants.rdp_math import (
    delta_from_rdp,
    epsilon_from_rdp,
    exponential_mechanism_rdp,
    laplace_rdp,
    mixture_of_gaussians_rdp,
    pure_dp_rdp,
    randomized_response_rdp,
    sampled_without_replacement_gaussian_rdp,
    subsampled_gaussian_rdp,
)
from dpcore.errors import InvalidParameterError
from dpcore.events import (
    DpEvent,
    EpsilonDeltaEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    LaplaceEvent,
    MixtureOfGaussiansEvent,
    PoissonSampledEvent,
    RandomAllocationEvent,
    RandomizedResponseEvent,
    SampledWithoutReplacementEvent,
)
from dpcore.validation import check_count

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

    Supports Gaussian, Laplace and pure epsilon-DP steps, randomized response (exact RDP),
    the exponential mechanism (bounded range), Poisson-subsampled Gaussians and mixtures of
    Gaussians under add/remove-one neighbouring, and Gaussians on fixed-size samples drawn
    without replacement under replace-one neighbouring (the relation that analysis needs).

    **Group privacy** (``group_size = k``): a Gaussian step becomes the Gaussian with
    sensitivity k (noise multiplier sigma / k) and a Laplace step the Laplace with sensitivity k
    (scale b / k), both exact (a group moves the query by at most k sensitivities); a pure
    epsilon-DP step (including randomized response) becomes (k epsilon)-DP (Dwork & Roth 2014,
    Thm 2.2) and an epsilon-bounded-range step k epsilon-bounded-range (the privacy loss of the
    group is the sum of k losses, each in an interval of width epsilon; Durfee & Rogers 2019,
    Def. 3.1). Sampled events and mixtures of Gaussians are refused for k > 1: their group RDP
    is not a rescaling of the individual one.

    Args:
        orders: RDP orders > 1 (default :data:`DEFAULT_ORDERS`).
        neighboring_relation: ``add_or_remove_one`` (default) or ``replace_one``.
        group_size: k >= 1, the number of records in which neighbours differ (1: ordinary DP).

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
        group_size: int = 1,
    ) -> None:
        super().__init__()
        self._group_size = check_count("group_size", group_size, minimum=1)
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
        #: Sum of the composed steps' pure-DP epsilons (inf once a step is not pure DP).
        self._pure_epsilon = 0.0

    @property
    def orders(self) -> np.ndarray:
        """The order grid (sorted, read-only copy)."""
        return self._orders.copy()

    @property
    def rdp(self) -> np.ndarray:
        """The accumulated RDP at each order."""
        return self._rdp.copy()

    @property
    def group_size(self) -> int:
        """The group size k the guarantees are for."""
        return self._group_size

    @property
    def pure_epsilon(self) -> float:
        """Sum of the composed steps' pure-DP epsilons: inf unless every step is pure DP."""
        return self._pure_epsilon

    def config(self) -> dict[str, Any]:
        return {
            "orders": [float(o) for o in self._orders],
            "neighboring_relation": self._relation.value,
            "group_size": self._group_size,
        }

    def _leaf_reason(self, event: DpEvent) -> str | None:
        poisson = isinstance(event, PoissonSampledEvent)
        without = isinstance(event, SampledWithoutReplacementEvent)
        if without and self._relation is not NeighboringRelation.REPLACE_ONE:
            return "sampling without replacement is analysed under replace_one neighbouring only"
        if poisson and self._relation is not NeighboringRelation.ADD_OR_REMOVE_ONE:
            return "Poisson sampling is analysed under add_or_remove_one neighbouring only"
        allocation = isinstance(event, RandomAllocationEvent)
        if allocation and self._relation is not NeighboringRelation.ADD_OR_REMOVE_ONE:
            return "random allocation is analysed under add_or_remove_one neighbouring only"
        if isinstance(event, EpsilonDeltaEvent) and event.delta > 0:
            return "an (epsilon, delta) event with delta > 0 has no RDP curve"
        mixture = isinstance(event, MixtureOfGaussiansEvent)
        if mixture and self._relation is not NeighboringRelation.ADD_OR_REMOVE_ONE:
            return "a mixture of Gaussians is analysed under add_or_remove_one neighbouring only"
        sampled = (PoissonSampledEvent, SampledWithoutReplacementEvent, RandomAllocationEvent)
        if self._group_size > 1 and (mixture or isinstance(event, sampled)):
            return (
                "group privacy (group_size > 1) of a sampled event or a mixture of Gaussians "
                "is not a rescaling of its RDP and is not supported"
            )
        return None

    @handles((GaussianEvent,))
    def _gaussian(self, event: GaussianEvent, count: int) -> None:
        self._add(
            count,
            subsampled_gaussian_rdp(
                sampling_probability=1.0,
                noise_multiplier=event.noise_multiplier / self._group_size,
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
            pure=math.inf if event.sampling_probability > 0 else 0.0,
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
            pure=math.inf if event.sample_size > 0 else 0.0,
        )

    @handles((RandomAllocationEvent, GaussianEvent))
    def _random_allocation_gaussian(self, event: RandomAllocationEvent, count: int) -> None:
        """Per epoch, the larger of the remove and add directions of the dominating pair
        (:mod:`dpcore.accountants.random_allocation_math`)."""
        inner = event.event
        assert isinstance(inner, GaussianEvent)
        self._add(
            count,
            random_allocation_gaussian_rdp(
                num_steps=event.num_steps,
                noise_multiplier=inner.noise_multiplier,
                orders=self._orders,
            ),
        )

    @handles((LaplaceEvent,))
    def _laplace(self, event: LaplaceEvent, count: int) -> None:
        scale = event.noise_multiplier / self._group_size
        pure = math.inf if scale == 0 else 1.0 / scale  # Dwork & Roth 2014, Thm 3.6
        self._add(count, laplace_rdp(noise_multiplier=scale, orders=self._orders), pure=pure)

    @handles((EpsilonDeltaEvent,))
    def _pure(self, event: EpsilonDeltaEvent, count: int) -> None:
        epsilon = self._group_size * event.epsilon
        self._add(count, pure_dp_rdp(epsilon=epsilon, orders=self._orders), pure=epsilon)

    @handles((RandomizedResponseEvent,))
    def _randomized_response(self, event: RandomizedResponseEvent, count: int) -> None:
        epsilon = randomized_response_epsilon(
            noise_parameter=event.noise_parameter, num_buckets=event.num_buckets
        )
        if self._group_size == 1:
            rdp = randomized_response_rdp(
                noise_parameter=event.noise_parameter,
                num_buckets=event.num_buckets,
                orders=self._orders,
            )
        else:  # (k epsilon)-DP for the group: the pure-DP bound
            epsilon = self._group_size * epsilon
            rdp = self._pure_rdp(epsilon)
        self._add(count, rdp, pure=epsilon)

    @handles((ExponentialMechanismEvent,))
    def _exponential(self, event: ExponentialMechanismEvent, count: int) -> None:
        epsilon = self._group_size * event.epsilon
        rdp = exponential_mechanism_rdp(epsilon=epsilon, orders=self._orders)
        self._add(count, rdp, pure=epsilon)

    @handles((MixtureOfGaussiansEvent,))
    def _mixture(self, event: MixtureOfGaussiansEvent, count: int) -> None:
        rdp = mixture_of_gaussians_rdp(
            noise_multiplier=event.noise_multiplier,
            sensitivities=event.sensitivities,
            probabilities=event.probabilities,
            orders=self._orders,
        )
        pairs = zip(event.sensitivities, event.probabilities, strict=True)
        shifted = any(c > 0 and p > 0 for c, p in pairs)
        self._add(count, rdp, pure=math.inf if shifted else 0.0)

    def _pure_rdp(self, epsilon: float) -> np.ndarray:
        if math.isinf(epsilon):
            return np.full(self._orders.shape, math.inf)
        return pure_dp_rdp(epsilon=epsilon, orders=self._orders)

    def _add(self, count: int, rdp: np.ndarray, *, pure: float = math.inf) -> None:
        """Add ``count`` times the step's RDP curve; ``pure`` is its pure-DP epsilon (inf,
        the default, for a step that is not pure DP)."""
        with np.errstate(invalid="ignore"):
            step = np.where(rdp == 0, 0.0, count * rdp)  # 0 * inf stays 0 only for zero RDP
        self._rdp = self._rdp + step
        if pure > 0:
            self._pure_epsilon += count * pure

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
        """(epsilon, the RDP order that attains it); order inf where the pure-DP sum does."""
        epsilon = self.get_epsilon(target_delta)
        if target_delta == 0:
            return epsilon, math.inf
        value, order = epsilon_from_rdp(orders=self._orders, rdp=self._rdp, delta=target_delta)
        return epsilon, (math.inf if self._pure_epsilon < value else order)

    def _epsilon(self, delta: float) -> float:
        if delta == 0:
            return self._pure_epsilon
        if not np.any(self._rdp > 0):
            return 0.0
        epsilon, order = epsilon_from_rdp(orders=self._orders, rdp=self._rdp, delta=delta)
        if self._pure_epsilon < epsilon:
            return self._pure_epsilon  # pure epsilon-DP is (epsilon, delta)-DP for every delta
        if math.isfinite(epsilon) and epsilon > 0:
            self._check_edge(order, "epsilon")
        return epsilon

    def _delta(self, epsilon: float) -> float:
        if epsilon >= self._pure_epsilon or not np.any(self._rdp > 0):
            return 0.0
        delta, order = delta_from_rdp(orders=self._orders, rdp=self._rdp, epsilon=epsilon)
        if 0 < delta < 1:
            self._check_edge(order, "delta")
        return delta
