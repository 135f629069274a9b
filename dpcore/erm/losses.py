"""Margin losses ell(z), z = y w^T x, with the constants the private ERM theorems need.

Chaudhuri, Monteleoni, Sarwate 2011 (JMLR 12, "Differentially Private Empirical Risk
Minimization", henceforth CMS) analyse J(w) = (1/n) sum_i ell(y_i w^T x_i) + (lambda/2) ||w||^2
with ||x_i|| <= 1, a convex loss with |ell'| <= L = 1 and, for objective perturbation,
|ell''| <= c. Logistic regression has c = 1/4; CMS's Huber loss of width h (their Eq. (7))
has c = 1/(2h).
"""

from __future__ import annotations

import abc
import dataclasses
import math

import numpy as np
from scipy import special

from dpcore.errors import InvalidParameterError
from dpcore.validation import check_positive

__all__ = ["HuberLoss", "LogisticLoss", "MarginLoss"]

FloatArray = np.ndarray


class MarginLoss(abc.ABC):
    """A convex loss of the margin z with |ell'(z)| <= ``lipschitz`` and ell'' <= ``smoothness``."""

    name: str
    lipschitz: float
    smoothness: float

    @abc.abstractmethod
    def value(self, margins: FloatArray) -> FloatArray:
        """ell(z), elementwise."""

    @abc.abstractmethod
    def derivative(self, margins: FloatArray) -> FloatArray:
        """ell'(z), elementwise."""

    @abc.abstractmethod
    def second_derivative(self, margins: FloatArray) -> FloatArray:
        """ell''(z), elementwise (where it exists; the Huber loss is C^1 with a.e. ell'')."""


@dataclasses.dataclass(frozen=True)
class LogisticLoss(MarginLoss):
    """ell(z) = log(1 + e^{-z}); |ell'| <= 1, 0 < ell'' <= 1/4 (CMS §3.4, logistic regression).

    >>> loss = LogisticLoss()
    >>> float(loss.value(np.array([0.0]))[0]), loss.lipschitz, loss.smoothness
    (0.6931471805599453, 1.0, 0.25)
    """

    name: str = "logistic"
    lipschitz: float = 1.0
    smoothness: float = 0.25

    def value(self, margins: FloatArray) -> FloatArray:
        return np.asarray(np.logaddexp(0.0, -margins), dtype=float)

    def derivative(self, margins: FloatArray) -> FloatArray:
        return np.asarray(-special.expit(-margins), dtype=float)

    def second_derivative(self, margins: FloatArray) -> FloatArray:
        return np.asarray(special.expit(margins) * special.expit(-margins), dtype=float)


@dataclasses.dataclass(frozen=True, init=False)
class HuberLoss(MarginLoss):
    """CMS's Huber (smoothed hinge) loss, Eq. (7), of width h > 0; |ell'| <= 1, ell'' <= 1/(2h).

    ell(z) = 0 for z > 1 + h; (1 + h - z)^2 / (4h) for |1 - z| <= h; 1 - z for z < 1 - h.

    >>> loss = HuberLoss(h=0.5)
    >>> loss.smoothness, [float(v) for v in loss.value(np.array([2.0, 1.0, 0.0]))]
    (1.0, [0.0, 0.125, 1.0])
    """

    h: float
    name: str
    lipschitz: float
    smoothness: float

    def __init__(self, *, h: float = 0.5) -> None:
        width = check_positive("h", h)
        if not math.isfinite(1.0 / (2.0 * width)):
            raise InvalidParameterError("h", "large enough that 1/(2h) is finite", h)
        object.__setattr__(self, "h", width)
        object.__setattr__(self, "name", f"huber(h={width:g})")
        object.__setattr__(self, "lipschitz", 1.0)
        object.__setattr__(self, "smoothness", 1.0 / (2.0 * width))

    def value(self, margins: FloatArray) -> FloatArray:
        z = np.asarray(margins, dtype=float)
        # (1 + h - z) * ((1 + h - z) / 4h): no overflow of the square for huge h.
        quadratic = (1.0 + self.h - z) * ((1.0 + self.h - z) / (4.0 * self.h))
        return np.where(z > 1 + self.h, 0.0, np.where(z < 1 - self.h, 1.0 - z, quadratic))

    def derivative(self, margins: FloatArray) -> FloatArray:
        z = np.asarray(margins, dtype=float)
        return np.asarray(np.clip(-(1.0 + self.h - z) / (2.0 * self.h), -1.0, 0.0), dtype=float)

    def second_derivative(self, margins: FloatArray) -> FloatArray:
        z = np.asarray(margins, dtype=float)
        inside = np.abs(1.0 - z) <= self.h
        return np.where(inside, 1.0 / (2.0 * self.h), 0.0)
