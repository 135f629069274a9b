"""CIFAR-10 inputs of the Abadi et al. 2016 reproduction (§5.3): crops, distortions, scaling.

Training images are distorted afresh every epoch as in the TensorFlow CIFAR-10 tutorial, to
which §5.3 refers for details: a random 24x24 crop, a random left-right flip, a random brightness
shift and contrast factor, then per-image standardisation. Test images are centre-cropped and
standardised.
"""

from __future__ import annotations

import math

import numpy as np
import torch

#: The tutorial's distortion ranges: brightness shift up to 63 (of 255), contrast in [0.2, 1.8].
BRIGHTNESS, CONTRAST = 63.0, (0.2, 1.8)


def standardize(images: np.ndarray) -> np.ndarray:
    """Per image: subtract the mean, divide by max(std, 1/sqrt(#values)) (TF tutorial)."""
    flat = images.reshape(len(images), -1).astype(np.float32)
    mean = flat.mean(axis=1, keepdims=True)
    std = np.maximum(flat.std(axis=1, keepdims=True), 1.0 / math.sqrt(flat.shape[1]))
    result: np.ndarray = ((flat - mean) / std).reshape(images.shape)
    return result


def center_crop(images: np.ndarray, crop: int) -> np.ndarray:
    """The central ``crop`` x ``crop`` patch of (n, 3, H, W) images."""
    top, left = (images.shape[2] - crop) // 2, (images.shape[3] - crop) // 2
    return images[:, :, top : top + crop, left : left + crop]


def evaluation_inputs(images: np.ndarray, crop: int) -> torch.Tensor:
    """Test-time inputs: centre crop, per-image standardisation."""
    return torch.from_numpy(standardize(center_crop(images, crop)))


def augment(
    images: np.ndarray, crop: int, rng: np.random.Generator, chunk: int = 5000
) -> torch.Tensor:
    """One epoch's distorted copies: random crop, flip, brightness, contrast, standardise."""
    n, _, height, width = images.shape
    out = np.empty((n, 3, crop, crop), dtype=np.float32)
    span = np.arange(crop)
    for first in range(0, n, chunk):
        part = images[first : first + chunk]
        m = len(part)
        rows = rng.integers(0, height - crop + 1, size=m)[:, None] + span
        cols = rng.integers(0, width - crop + 1, size=m)[:, None] + span
        patch = part[
            np.arange(m)[:, None, None, None],
            np.arange(3)[None, :, None, None],
            rows[:, None, :, None],
            cols[:, None, None, :],
        ].astype(np.float32)
        flip = rng.random(m) < 0.5
        patch[flip] = patch[flip][..., ::-1]
        patch += rng.uniform(-BRIGHTNESS, BRIGHTNESS, size=(m, 1, 1, 1)).astype(np.float32)
        means = patch.mean(axis=(2, 3), keepdims=True)
        factor = rng.uniform(*CONTRAST, size=(m, 1, 1, 1)).astype(np.float32)
        out[first : first + m] = standardize((patch - means) * factor + means)
    return torch.from_numpy(out)
