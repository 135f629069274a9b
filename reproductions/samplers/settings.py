"""The DP-SGD settings of the sampler table (each from its paper, cited per row)."""

from __future__ import annotations

import dataclasses

DELTA = 1e-5


@dataclasses.dataclass(frozen=True)
class Setting:
    """One DP-SGD run: N records, batches of B (q = B / N), sigma, epochs of N // B steps."""

    paper: str
    label: str
    dataset_size: int
    batch_size: int
    noise_multiplier: float
    epochs: int

    @property
    def steps_per_epoch(self) -> int:
        return self.dataset_size // self.batch_size

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch


SETTINGS = (
    # Abadi et al. 2016, Sec. 5.2 / Fig. 3: L = 600 of 60,000, sigma 8 / 4 / 2, about 16 / 130 /
    # 780 epochs (training steps only; the DP-PCA is left out here).
    Setting("Abadi et al. 2016", "MNIST, large noise", 60_000, 600, 8.0, 16),
    Setting("Abadi et al. 2016", "MNIST, medium noise", 60_000, 600, 4.0, 130),
    Setting("Abadi et al. 2016", "MNIST, small noise", 60_000, 600, 2.0, 780),
    # Bu et al. 2021, Sec. 5 / Fig. 4: batch 256 of 60,000, sigma 1.1, 60 epochs (TF Privacy
    # tutorial schedule, as in reproductions.bu2021_jl.accuracy_setup).
    Setting("Bu et al. 2021", "MNIST Fig. 4", 60_000, 256, 1.1, 60),
)
