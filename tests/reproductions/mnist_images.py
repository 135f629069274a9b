"""Generated MNIST-like digits for the Abadi et al. 2016 reproductions' tests (no download)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Loader = Callable[[str], tuple[np.ndarray, np.ndarray]]


def patterned_digits(side: int, train: int, test: int = 50) -> Loader:
    """A stand-in for ``load_mnist(split)``: ten classes, each a fixed random ``side x side``
    pattern plus uniform noise, as uint8 images and int64 labels (``train`` images for
    ``"train"``, ``test`` for any other split), the same on every call."""

    def load(split: str) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(0 if split == "train" else 1)
        patterns = np.random.default_rng(7).uniform(0, 200, size=(10, side, side))
        n = train if split == "train" else test
        labels = rng.integers(0, 10, size=n)
        images = patterns[labels] + rng.uniform(0, 55, size=(n, side, side))
        return images.astype(np.uint8), labels.astype(np.int64)

    return load
