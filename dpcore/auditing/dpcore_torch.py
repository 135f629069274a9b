"""dpcore's own DP-SGD behind the audit contract, used as a user would: ``LotLoader`` +
``make_private`` + ``optimizer.step(micro)`` (the records carry their index so that the adapter
can report each lot; the index never reaches the model).

Audit dpcore's torch training like any other implementation (needs torch)::

    from dpcore.auditing import audit_implementation
    from dpcore.auditing.dpcore_torch import DpcoreTorch

    report = audit_implementation(DpcoreTorch(), executor="processes:2")
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dpcore.auditing.implementation import AuditTask, Claim, Observer
from dpcore.auditing.torch_model import parameters_of, torch_loss, torch_model, torch_targets
from dpcore.errors import InvalidParameterError
from dpcore.torch.loaders import LotLoader
from dpcore.torch.private import make_private
from dpcore.torch.samplers import PoissonMismatchWarning, ShuffledBatchSampler


@dataclasses.dataclass
class DpcoreTorch:
    """dpcore (torch): Poisson lots (``sampler="poisson"``) or, as a contrast, shuffled batches.

    Raises:
        InvalidParameterError: ``sampler`` is not "poisson" or "shuffle".
    """

    sampler: str = "poisson"

    def __post_init__(self) -> None:
        if self.sampler not in ("poisson", "shuffle"):
            raise InvalidParameterError("sampler", "'poisson' or 'shuffle'", self.sampler)

    @property
    def name(self) -> str:
        """The implementation's name in reports."""
        return f"dpcore torch ({self.sampler} sampling)"

    def train(self, task: AuditTask, observer: Observer) -> Claim:
        torch.manual_seed(task.seed)
        x, y = torch.from_numpy(task.features), torch_targets(task)
        dataset = TensorDataset(x, y, torch.arange(task.dataset_size))
        if self.sampler == "poisson":
            loader = LotLoader(
                dataset, sampling_probability=task.sampling_probability, seed=task.seed
            )
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PoissonMismatchWarning)
                sampler = ShuffledBatchSampler(
                    task.dataset_size, batch_size=task.batch_size, seed=task.seed
                )
                loader = LotLoader(dataset, sampler=sampler)
        model: torch.nn.Module = torch_model(task)
        model, optimizer, loader = make_private(
            model,
            torch.optim.SGD(model.parameters(), lr=task.learning_rate),
            loader,
            loss_fn=torch_loss(task),
            max_grad_norm=task.max_grad_norm,
            noise_multiplier=task.noise_multiplier,
            engine="fast",
            split=lambda batch: (batch[0], batch[1]),
            seed=task.seed,
        )
        used: list[np.ndarray] = []
        while optimizer.ledger.steps < task.steps:
            for micro in loader:
                if micro.data is not None:
                    used.append(micro.data[2].numpy())
                if optimizer.step(micro) is not None:
                    observer.step(
                        parameters_of(model), np.concatenate(used) if used else np.array([])
                    )
                    used = []
                    if optimizer.ledger.steps == task.steps:
                        break
        return Claim(
            implementation=self.name,
            sampler=self.sampler,
            accounting_assumes="poisson",
            sampling_probability=task.sampling_probability,
            noise_multiplier=task.noise_multiplier,
            max_grad_norm=task.max_grad_norm,
            steps=task.steps,
            delta=task.delta,
            epsilon=optimizer.epsilon(delta=task.delta, accountant="pld")
            if task.report_epsilon
            else None,
            accountant="dpcore pld (certified upper)",
        )
