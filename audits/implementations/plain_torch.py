"""A DP-SGD loop written from scratch in plain torch, the way a user writes one, behind the audit
contract; each planted bug (:data:`PLANTED_BUGS`) changes one part of it.

The implementation under audit is all here: its own Poisson sampling (a seeded ``torch.rand``
mask), per-example gradients (``torch.func.vmap(grad)`` over the task's model, built by
:func:`dpcore.auditing.torch_model.torch_model`), clipping, Gaussian noise and SGD update.
Nothing of dpcore's training code is used; the auditor sees only the parameter trace and the
lots. Bugs, each still claiming the correct algorithm's epsilon:

* ``halved noise``: noise standard deviation sigma C / 2;
* ``noise sigma, not sigma C``: the noise forgets the clipping norm (C = 2 in the audits);
* ``no clipping``: per-example gradients are summed unclipped;
* ``realised lot size``: the noisy sum is divided by |L| instead of q N;
* ``shuffled as Poisson``: fixed-size batches from a per-epoch shuffle, accounted as Poisson;
* ``noise per worker``: 4 data-parallel workers each draw N(0, sigma^2 C^2) and the all-reduce
  averages the noises (while summing gradients): noise sigma C / 2;
* ``noise once per 4 lots``: clipped sums of 4 lots are accumulated and noised once (one update
  per 4 lots) while 4 steps are accounted;
* ``per-tensor clipping``: each parameter tensor of each example is clipped to C on its own
  (an example's norm up to C sqrt(L));
* ``no noise on biases``: the biases sit in their own parameter group (as for "no weight
  decay"), and the noise is added to the weights' group only;
* ``class weights after clipping``: balanced class weights n / (K n_c) multiply the clipped
  per-example gradients (a rare-class example contributes w_c C);
* ``skipped empty lots``: an empty lot is skipped (no noise, no update) but the step counted;
* ``reused noise``: one noise draw, made before training, is added at every step;
* ``lots replayed each epoch``: the Poisson lots of the first epoch (round(1/q) steps) are
  replayed in every later epoch;
* ``accumulation noised per micro-batch``: each lot is processed in 4 micro-batches, each
  noised by N(0, (sigma C / 4)^2): the summed noise is sigma C / 2.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from dpcore.auditing.implementation import AuditTask, Claim, Observer
from dpcore.auditing.torch_model import torch_loss, torch_model, torch_targets

#: bug name -> description (see the module doc); "" is the correct loop
PLANTED_BUGS = (
    "halved noise",
    "noise sigma, not sigma C",
    "no clipping",
    "realised lot size",
    "shuffled as Poisson",
    "noise per worker",
    "noise once per 4 lots",
    "per-tensor clipping",
    "no noise on biases",
    "class weights after clipping",
    "skipped empty lots",
    "reused noise",
    "lots replayed each epoch",
    "accumulation noised per micro-batch",
)
#: the audit meant to flag each planted bug (:mod:`dpcore.auditing.implementation_audits`)
TEST_FOR_BUG = {
    "halved noise": "noise_calibration",
    "noise sigma, not sigma C": "noise_calibration",
    "no clipping": "canary_per_tensor",
    "realised lot size": "noise_calibration",
    "shuffled as Poisson": "sampler_lots",
    "noise per worker": "noise_calibration",
    "noise once per 4 lots": "noise_calibration",
    "per-tensor clipping": "canary_per_tensor",
    "no noise on biases": "noise_per_tensor",
    "class weights after clipping": "canary_per_tensor",
    "skipped empty lots": "empty_lots",
    "reused noise": "noise_correlation",
    "lots replayed each epoch": "sampler_lots",
    "accumulation noised per micro-batch": "noise_calibration",
}
WORKERS = 4
ACCUMULATED_LOTS = 4
MICRO_BATCHES = 4


@dataclasses.dataclass
class PlainTorchDpSgd:
    """Hand-written DP-SGD; ``bug`` is "" (correct) or one of :data:`PLANTED_BUGS`."""

    bug: str = ""

    @property
    def name(self) -> str:
        return f"hand-written torch loop ({self.bug or 'correct'})"

    def _lot(
        self, generator: torch.Generator, n: int, q: float, batch: int, t: int, memory: list[Any]
    ) -> torch.Tensor:
        if self.bug == "shuffled as Poisson":
            per_epoch = n // batch
            if t % per_epoch == 0:
                memory[:] = [torch.randperm(n, generator=generator)]
            start = (t % per_epoch) * batch
            lot: torch.Tensor = memory[0][start : start + batch]
            return lot
        if self.bug == "lots replayed each epoch":
            epoch = max(1, round(1 / q))
            if t < epoch:
                memory.append(torch.nonzero(torch.rand(n, generator=generator) < q).reshape(-1))
            replayed: torch.Tensor = memory[t % epoch]
            return replayed
        return torch.nonzero(torch.rand(n, generator=generator) < q).reshape(-1)

    def train(self, task: AuditTask, observer: Observer) -> Claim:
        generator = torch.Generator().manual_seed(task.seed)
        x, y = torch.from_numpy(task.features), torch_targets(task)
        model = torch_model(task)
        loss_fn = torch_loss(task)
        names = [name for name, _ in model.named_parameters()]
        params = {name: p.detach().clone() for name, p in model.named_parameters()}

        def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
            out = torch.func.functional_call(model, p, (xi[None],))
            return loss_fn(out, yi[None]).sum()

        per_example = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
        n, c, sigma, q = (
            task.dataset_size,
            task.max_grad_norm,
            task.noise_multiplier,
            task.sampling_probability,
        )
        expected = q * n
        std = {
            "halved noise": sigma * c / 2,
            "noise sigma, not sigma C": sigma,
            "noise per worker": sigma * c / WORKERS**0.5,  # mean of 4 independent draws
            "accumulation noised per micro-batch": sigma * c / MICRO_BATCHES,
        }.get(self.bug, sigma * c)
        class_weight = torch.ones(int(y.max()) + 1 if y.dtype == torch.int64 else 1)
        if self.bug == "class weights after clipping" and y.dtype == torch.int64:
            counts = torch.bincount(y).double()
            class_weight = (n / (counts.numel() * counts.clamp(min=1))).float()
        reused = {k: std * torch.randn(v.shape, generator=generator) for k, v in params.items()}

        def noise(name: str) -> torch.Tensor:
            if self.bug == "reused noise":
                return reused[name]
            if self.bug == "no noise on biases" and name.endswith("bias"):
                return torch.zeros_like(params[name])
            return std * torch.randn(params[name].shape, generator=generator)

        def clipped_sum(lot: torch.Tensor) -> dict[str, torch.Tensor]:
            if lot.numel() == 0:
                return {k: torch.zeros_like(v) for k, v in params.items()}
            grads = per_example(params, x[lot], y[lot])
            if self.bug == "per-tensor clipping":
                for k in names:
                    norms = grads[k].reshape(lot.numel(), -1).norm(dim=1)
                    factor = torch.clamp(c / norms, max=1.0)
                    grads[k] = grads[k] * factor.reshape(-1, *[1] * (grads[k].dim() - 1))
            elif self.bug != "no clipping":
                norms = torch.stack(
                    [g.reshape(lot.numel(), -1).norm(dim=1) for g in grads.values()]
                )
                factor = torch.clamp(c / norms.norm(dim=0), max=1.0)
                if self.bug == "class weights after clipping" and y.dtype == torch.int64:
                    factor = factor * class_weight[y[lot]]
                for k in names:
                    grads[k] = grads[k] * factor.reshape(-1, *[1] * (grads[k].dim() - 1))
            return {k: g.sum(dim=0) for k, g in grads.items()}

        memory: list[Any] = []
        pending, accumulated = 0, {k: torch.zeros_like(v) for k, v in params.items()}
        for t in range(task.steps):
            lot = self._lot(generator, n, q, task.batch_size, t, memory)
            if self.bug == "skipped empty lots" and lot.numel() == 0:
                observer.step(tuple(params[k].numpy() for k in names), lot.numpy())
                continue
            if self.bug == "accumulation noised per micro-batch":
                summed = {k: torch.zeros_like(v) for k, v in params.items()}
                for micro in torch.tensor_split(lot, MICRO_BATCHES):
                    part = clipped_sum(micro)
                    summed = {k: summed[k] + part[k] + noise(k) for k in names}
                params = {k: params[k] - task.learning_rate * summed[k] / expected for k in names}
            elif self.bug == "noise once per 4 lots":
                summed = clipped_sum(lot)
                accumulated = {k: accumulated[k] + summed[k] for k in names}
                pending += 1
                if pending == ACCUMULATED_LOTS:
                    params = {
                        k: params[k]
                        - task.learning_rate * (accumulated[k] + noise(k)) / (pending * expected)
                        for k in names
                    }
                    pending, accumulated = 0, {k: torch.zeros_like(v) for k, v in params.items()}
            else:
                summed = clipped_sum(lot)
                divisor = max(1, lot.numel()) if self.bug == "realised lot size" else expected
                params = {
                    k: params[k] - task.learning_rate * (summed[k] + noise(k)) / divisor
                    for k in names
                }
            observer.step(tuple(params[k].numpy() for k in names), lot.numpy())
        return Claim(
            implementation=self.name,
            sampler="shuffle" if self.bug == "shuffled as Poisson" else "poisson",
            accounting_assumes="poisson",
            sampling_probability=q,
            noise_multiplier=sigma,
            max_grad_norm=c,
            steps=task.steps,
            delta=task.delta,
        )
