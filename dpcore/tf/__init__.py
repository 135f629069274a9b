"""DP training in TensorFlow / Keras 3: Poisson lots, exact or JL clipping, noise, one ledger.

Requires the ``tf`` extra (``pip install dpcore[tf]``: TensorFlow >= 2.16 with Keras 3). The
privacy side is shared with :mod:`dpcore.torch`: the same :class:`~dpcore.ledger.PrivacyLedger`,
events and statement. The parts:

- :mod:`dpcore.tf.lots` draws Poisson lots over in-memory arrays or a finite ``tf.data``
  dataset (variable sizes, empty lots included);
- :mod:`dpcore.tf.losses` turns a Keras loss into one loss per example;
- :mod:`dpcore.tf.ghost` (norms from layer inputs and output gradients, for Dense, Embedding,
  Conv1D/2D and LayerNormalization) and :mod:`dpcore.tf.jacobian` (per-example gradients of any
  other model) clip exactly; :mod:`dpcore.tf.jl` estimates the norms with forward-mode
  projections (Bu et al. 2021); :mod:`dpcore.tf.clipping` picks one;
- :mod:`dpcore.tf.noise` draws the Gaussian noise (seeded or from the OS);
- :mod:`dpcore.tf.model` (:class:`~dpcore.tf.model.DPModel`) trains any Keras model with
  ``model.fit``: DP-SGD, DP-Adam and their JL variants, epsilon in Keras's progress bar.
"""

from dpcore.tf.clipping import Clipper
from dpcore.tf.lots import PoissonLots
from dpcore.tf.model import DPModel, EpsilonCallback

__all__ = ["Clipper", "DPModel", "EpsilonCallback", "PoissonLots"]
