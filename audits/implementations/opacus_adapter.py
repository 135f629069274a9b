"""Opacus 1.6 behind the audit contract, used as its tutorials do: ``PrivacyEngine().make_private``
over a ``DataLoader``, ``loss.backward()``, ``optimizer.step()``; Poisson sampling on (its
default) or off (the loader's own shuffled fixed-size batches). Its claimed epsilon is its own
accountant's (``PrivacyEngine(accountant="prv")``, the 1.6 default). Opacus is a test/audit-only
dependency; dpcore never imports it."""

from __future__ import annotations

import dataclasses
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

from dpcore.auditing.implementation import AuditTask, Claim, Observer
from dpcore.auditing.torch_model import parameters_of, torch_loss, torch_model, torch_targets


class _MeanLoss(torch.nn.Module):
    """The task's per-example loss averaged over the batch (Opacus' ``loss_reduction="mean"``)."""

    def __init__(self, task: AuditTask) -> None:
        super().__init__()
        self.per_example = torch_loss(task)

    def forward(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.per_example(outputs, targets).mean()


@dataclasses.dataclass
class Opacus:
    """Opacus' DP-SGD; ``poisson_sampling`` as in ``make_private``."""

    poisson_sampling: bool = True

    @property
    def name(self) -> str:
        mode = "Poisson sampling" if self.poisson_sampling else "shuffled batches"
        return f"opacus 1.6 ({mode})"

    def train(self, task: AuditTask, observer: Observer) -> Claim:
        from opacus import PrivacyEngine

        torch.manual_seed(task.seed)
        x, y = torch.from_numpy(task.features), torch_targets(task)
        dataset = TensorDataset(x, y, torch.arange(task.dataset_size))
        loader = DataLoader(dataset, batch_size=task.batch_size, shuffle=True)
        model = torch_model(task)
        criterion = _MeanLoss(task)
        with warnings.catch_warnings():
            # Opacus warns that secure RNG is off (seeded runs are what an audit needs) and
            # about empty Poisson lots (which it handles)
            warnings.simplefilter("ignore")
            engine = PrivacyEngine(accountant="prv")
            model, optimizer, loader = engine.make_private(
                module=model,
                optimizer=torch.optim.SGD(model.parameters(), lr=task.learning_rate),
                data_loader=loader,
                noise_multiplier=task.noise_multiplier,
                max_grad_norm=task.max_grad_norm,
                poisson_sampling=self.poisson_sampling,
                criterion=criterion,
            )
            steps = 0
            while steps < task.steps:
                for inputs, targets, index in loader:
                    optimizer.zero_grad()
                    criterion(model(inputs), targets).backward()
                    optimizer.step()
                    steps += 1
                    observer.step(parameters_of(model), index.numpy())
                    if steps == task.steps:
                        break
            epsilon = engine.get_epsilon(task.delta) if task.report_epsilon else None
        return Claim(
            implementation=self.name,
            sampler="poisson" if self.poisson_sampling else "shuffle",
            accounting_assumes="poisson",
            sampling_probability=1 / len(loader),
            noise_multiplier=task.noise_multiplier,
            max_grad_norm=task.max_grad_norm,
            steps=task.steps,
            delta=task.delta,
            divisor=float(optimizer.expected_batch_size),
            epsilon=None if epsilon is None else float(epsilon),
            accountant="opacus prv",
        )
