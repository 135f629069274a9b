"""A DP-SGD loop written from scratch in plain torch, the way a user writes one, behind the audit
contract; each planted bug (:data:`PLANTED_BUGS`) changes one line of it.

The implementation under audit is all here: its own Poisson sampling (a seeded ``torch.rand``
mask), per-example gradients (``torch.func.vmap(grad)``), clipping, Gaussian noise and SGD
update. Nothing of dpcore's training code is used; the auditor sees only the parameter trace and
the lots. Bugs, each still claiming the correct algorithm's epsilon:

* ``halved noise``: noise standard deviation sigma C / 2;
* ``noise sigma, not sigma C``: the noise forgets the clipping norm (C = 2 in the audits);
* ``no clipping``: per-example gradients are summed unclipped;
* ``realised lot size``: the noisy sum is divided by |L| instead of q N;
* ``shuffled as Poisson``: fixed-size batches from a per-epoch shuffle, accounted as Poisson;
* ``noise per worker``: 4 data-parallel workers each draw N(0, sigma^2 C^2) and the all-reduce
  averages the noises (while summing gradients): noise sigma C / 2;
* ``noise once per 4 lots``: clipped sums of 4 lots are accumulated and noised once (one update
  per 4 lots) while 4 steps are accounted.
"""

from __future__ import annotations

import dataclasses

import torch

from dpcore.auditing.implementation import AuditTask, Claim, Observer

#: bug name -> description (see the module doc); "" is the correct loop
PLANTED_BUGS = (
    "halved noise",
    "noise sigma, not sigma C",
    "no clipping",
    "realised lot size",
    "shuffled as Poisson",
    "noise per worker",
    "noise once per 4 lots",
)
WORKERS = 4
ACCUMULATED_LOTS = 4


def _loss(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * (x @ w - y) ** 2


_per_example_grads = torch.func.vmap(torch.func.grad(_loss), in_dims=(None, 0, 0))


@dataclasses.dataclass
class PlainTorchDpSgd:
    """Hand-written DP-SGD; ``bug`` is "" (correct) or one of :data:`PLANTED_BUGS`."""

    bug: str = ""

    @property
    def name(self) -> str:
        return f"hand-written torch loop ({self.bug or 'correct'})"

    def _lot(
        self, generator: torch.Generator, n: int, batch: int, t: int, order: list
    ) -> torch.Tensor:
        if self.bug != "shuffled as Poisson":
            return torch.nonzero(torch.rand(n, generator=generator) < batch / n).reshape(-1)
        per_epoch = n // batch
        if t % per_epoch == 0:
            order[:] = [torch.randperm(n, generator=generator)]
        start = (t % per_epoch) * batch
        return order[0][start : start + batch]

    def train(self, task: AuditTask, observer: Observer) -> Claim:
        generator = torch.Generator().manual_seed(task.seed)
        x, y = torch.from_numpy(task.features), torch.from_numpy(task.targets)
        w = torch.from_numpy(task.initial_weight).clone()
        n, c, sigma = task.dataset_size, task.max_grad_norm, task.noise_multiplier
        expected = task.sampling_probability * n
        std = {
            "halved noise": sigma * c / 2,
            "noise sigma, not sigma C": sigma,
            "noise per worker": sigma * c / WORKERS**0.5,  # mean of 4 independent draws
        }.get(self.bug, sigma * c)
        order: list = []
        pending, accumulated = 0, torch.zeros_like(w)
        for t in range(task.steps):
            lot = self._lot(generator, n, task.batch_size, t, order)
            summed = torch.zeros_like(w)
            if lot.numel():  # an empty lot still steps, with noise only
                grads = _per_example_grads(w, x[lot], y[lot])
                if self.bug != "no clipping":
                    norms = grads.norm(dim=1, keepdim=True)
                    grads = grads * torch.clamp(c / norms, max=1.0)
                summed = grads.sum(dim=0)
            if self.bug == "noise once per 4 lots":
                accumulated, pending = accumulated + summed, pending + 1
                if pending == ACCUMULATED_LOTS:
                    noise = std * torch.randn(w.shape, generator=generator)
                    w = w - task.learning_rate * (accumulated + noise) / (pending * expected)
                    pending, accumulated = 0, torch.zeros_like(w)
            else:
                noise = std * torch.randn(w.shape, generator=generator)
                divisor = max(1, lot.numel()) if self.bug == "realised lot size" else expected
                w = w - task.learning_rate * (summed + noise) / divisor
            observer.step(w.numpy(), lot.numpy())
        return Claim(
            implementation=self.name,
            sampler="shuffle" if self.bug == "shuffled as Poisson" else "poisson",
            accounting_assumes="poisson",
            sampling_probability=task.sampling_probability,
            noise_multiplier=sigma,
            max_grad_norm=c,
            steps=task.steps,
            delta=task.delta,
            divisor=expected,
        )
