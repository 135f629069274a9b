"""Where floating point ends for a Gaussian noise multiplier, and what the accountants do there.

The closed forms of the Gaussian mechanism involve 1 / (2 sigma^2) (the privacy loss of a
shift by the sensitivity) and sigma^2. In IEEE doubles:

* below :data:`SIGMA_NOISELESS` (about 5.3e-155), 1 / (2 sigma^2) exceeds the largest float: a
  step that includes an example has a privacy loss beyond the float range, so every epsilon that
  depends on it is too, and IEEE rounding of such a number is inf. Accountants treat such a step
  as noiseless (sigma = 0): epsilon inf wherever the truth is beyond the float range;
* above :data:`SIGMA_HUGE` (1e150), sigma^2 overflows. A step's Renyi divergence is then at most
  a / (2 sigma^2) < 1e-299 a, the Gaussian's own (sampling never increases it), which the RDP
  and moments accountants use directly, computed as ``(a / (2 sigma)) / sigma``.
"""

from __future__ import annotations

import math
import sys

__all__ = ["SIGMA_HUGE", "SIGMA_NOISELESS", "gaussian_rdp", "is_huge", "is_noiseless"]

#: sigma below which 1 / (2 sigma^2) overflows: the step is treated as noiseless.
SIGMA_NOISELESS = 1.0 / (math.sqrt(2.0) * math.sqrt(sys.float_info.max))
#: sigma above which sigma^2 would overflow: the unsampled Gaussian's RDP bounds the step's.
SIGMA_HUGE = 1e150


def is_noiseless(sigma: float) -> bool:
    """True for sigma = 0 and for sigma so small that 1 / (2 sigma^2) overflows.

    Example:
        >>> is_noiseless(0.0), is_noiseless(1e-160), is_noiseless(1e-150)
        (True, True, False)
    """
    return sigma < SIGMA_NOISELESS


def is_huge(sigma: float) -> bool:
    """True for sigma above :data:`SIGMA_HUGE` (inf included)."""
    return sigma > SIGMA_HUGE


def gaussian_rdp(order: float, sigma: float) -> float:
    """RDP a / (2 sigma^2) of the Gaussian mechanism (Mironov 2017, Prop. 7), without overflow.

    inf for a noiseless sigma (see :func:`is_noiseless`); tiny or 0 for a huge one.

    Example:
        >>> gaussian_rdp(2.0, 1.0), gaussian_rdp(2.0, 1e300), gaussian_rdp(2.0, 1e-200)
        (1.0, 0.0, inf)
    """
    if is_noiseless(sigma):
        return math.inf
    return order / (2.0 * sigma) / sigma
