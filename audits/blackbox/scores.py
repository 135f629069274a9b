"""The attacker's scores: what the final model's outputs on the target say about membership.

Both are read from the logits of the target alone (black-box, final model only), oriented so
that a larger score means "the target was trained on":

- ``loss``: the target's cross-entropy loss (Yeom et al. 2018); the membership score is its
  negative (:data:`MEMBERSHIP_SIGN`);
- ``logit_margin``: the logit-scaled confidence of the target's label,
  ``z_y - logsumexp_{k != y} z_k = log(p_y / (1 - p_y))`` (Carlini et al. 2022, LiRA's
  calibrated statistic; for a fixed target a threshold on it is LiRA's test with equal
  variances in both worlds).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["MEMBERSHIP_SIGN", "SCORES", "target_scores"]

#: The scores each run records.
SCORES = ("loss", "logit_margin")
#: Multiply a recorded score by this to get a membership score (larger: more likely "in").
MEMBERSHIP_SIGN = {"loss": -1.0, "logit_margin": 1.0}


def target_scores(model: nn.Module, image: np.ndarray, label: np.ndarray) -> dict[str, float]:
    """The target's loss and logit margin on ``model`` (float64 from the logits).

    Args:
        model: the final model.
        image: the target, shape (1, 784).
        label: its label, shape (1,).
    """
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(image)).double()[0]
    y = int(label[0])
    others = torch.cat([logits[:y], logits[y + 1 :]])
    loss = float(torch.logsumexp(logits, 0) - logits[y])
    return {"loss": loss, "logit_margin": float(logits[y] - torch.logsumexp(others, 0))}
