"""Misusing the own-loop API (make_private + optimizer.step(micro)) never records what did not run.

Random sequences of what a user's loop may do — step the next micro-batch, step one again, skip
one, re-iterate the loader, feed one from another loader, add a parameter group, unfreeze a
frozen layer and add it, freeze or unfreeze a parameter, change the noise multiplier, save the
state and load it (or an older one) back — with the invariant after every call into dpcore:
either it ran, and the ledger holds exactly the steps that ran (recomputed here from what the
model actually did: a step ran when noise was drawn), or it raised a typed dpcore error and
nothing changed (parameters, torch optimizer state, loader and sampler state, ledger, noise).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import TensorDataset

from dpcore.errors import DPCoreError
from dpcore.torch.ledger import PrivacyLedger
from dpcore.torch.loaders import LotLoader, MicroBatch
from dpcore.torch.private import make_private
from dpcore.torch.samplers import PoissonSampler

N, Q, PHYSICAL, SIGMA = 10, 0.2, 2, 1.0
SIGMAS = (1.0, 2.0, 0.0, -1.0, math.nan)


def assert_same(before: Any, after: Any, path: str = "state") -> None:
    """Deep equality of snapshots: tensors bit for bit (NaN equal to NaN), dicts, sequences."""
    if isinstance(before, torch.Tensor):
        assert isinstance(after, torch.Tensor), path
        assert before.dtype == after.dtype and before.shape == after.shape, path
        torch.testing.assert_close(after, before, rtol=0, atol=0, equal_nan=True, msg=path)
    elif isinstance(before, dict):
        assert isinstance(after, dict) and before.keys() == after.keys(), path
        for key in before:
            assert_same(before[key], after[key], f"{path}[{key!r}]")
    elif isinstance(before, list | tuple):
        assert isinstance(after, list | tuple) and len(before) == len(after), path
        for index, (a, b) in enumerate(zip(before, after, strict=True)):
            assert_same(a, b, f"{path}[{index}]")
    elif isinstance(before, float) and math.isnan(before):
        assert isinstance(after, float) and math.isnan(after), path
    else:
        assert before == after, f"{path}: {before!r} != {after!r}"


class Loop:
    """A user's loop over one LotLoader, with the misuses of the module docstring."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        inputs = torch.randn(N, 3, generator=generator, dtype=torch.float64)
        data = TensorDataset(inputs, (inputs[:, 0] > 0).long())
        torch.manual_seed(0)
        self.model = nn.Sequential(
            nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)
        ).double()
        self.frozen = list(self.model[0].parameters())  # frozen from the start (fine-tuning)
        for parameter in self.frozen:
            parameter.requires_grad_(False)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.loader = LotLoader(
            data,
            sampler=PoissonSampler(N, sampling_probability=Q, seed=1),
            max_physical_batch_size=PHYSICAL,
        )
        self.other = LotLoader(data, sampling_probability=1.0, seed=2)
        sgd = torch.optim.SGD(self.trainable, lr=0.1, momentum=0.9)
        _, self.optimizer, _ = make_private(
            self.model,
            sgd,
            self.loader,
            loss_fn=nn.CrossEntropyLoss(reduction="none"),
            max_grad_norm=1.0,
            noise_multiplier=SIGMA,
            engine="fast",
            seed=3,
        )
        self.groups = len(sgd.param_groups)
        self.expected = PrivacyLedger(dataset_size=N, first_lot=0)
        self.stream: Iterator[MicroBatch] = iter(self.loader)
        self.other_stream: Iterator[MicroBatch] = iter(self.other)
        self.pulled: list[MicroBatch] = []
        self.saved: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = []
        self.outsiders: list[nn.Parameter] = []  # parameters the engine does not clip
        self.refused = self.ran = 0
        self._save(0)  # a checkpoint at the start, to go back to

    def snapshot(self) -> dict[str, Any]:
        """Everything a refused call must leave as it was."""
        return {
            "parameters": [p.detach().clone() for p in self.model.parameters()],
            "requires_grad": [p.requires_grad for p in self.model.parameters()],
            "outsiders": [p.detach().clone() for p in self.outsiders],
            "optimizer": copy.deepcopy(self.optimizer.optimizer.state_dict()),
            "loader": self.loader.state_dict(),
            "sampler": copy.deepcopy(self.loader.sampler.state_dict()),
            "ledger": self.optimizer.ledger.state_dict(),
            "noise": copy.deepcopy(self.optimizer.dp.noise.state_dict()),
        }

    def call(self, action: Callable[[], Any]) -> tuple[bool, Any]:
        """Run a dpcore call; a typed refusal must leave everything as it was."""
        before = self.snapshot()
        try:
            return True, action()
        except DPCoreError:
            assert_same(before, self.snapshot())
            self.refused += 1
            return False, None

    def pull(self, stream: str = "main") -> MicroBatch:
        loader = self.loader if stream == "main" else self.other
        current = self.stream if stream == "main" else self.other_stream
        try:
            micro = next(current)
        except StopIteration:  # the epoch ended: the next one
            current = iter(loader)
            micro = next(current)
        if stream == "main":
            self.stream = current
            self.pulled.append(micro)
        else:
            self.other_stream = current
        return micro

    def step(self, micro: MicroBatch) -> None:
        before = self.snapshot()
        sigma = self.optimizer.dp.noise_multiplier
        ok, result = self.call(lambda: self.optimizer.step(micro))
        if not ok:
            return
        after = self.snapshot()
        ran = not _same(before["noise"], after["noise"])  # noise drawn: a step ran
        assert (result is not None) == ran
        assert_same(before["outsiders"], after["outsiders"])  # never moved without noise
        if ran:
            assert micro.source is self.loader.token and micro.last
            # Recorded exactly once per lot, in order (the reference ledger refuses otherwise).
            self.expected.record(sampling_probability=Q, noise_multiplier=sigma, lot=micro.lot)
            assert not _same(before["parameters"], after["parameters"])
            self.ran += 1
        else:
            assert_same(before["parameters"], after["parameters"])
            assert_same(before["optimizer"], after["optimizer"])
        assert self.optimizer.ledger == self.expected

    # ------------------------------------------------------------------ the actions
    def act(self, name: str, choice: int) -> None:
        getattr(self, f"_{name}")(choice)
        assert self.optimizer.ledger == self.expected

    def _next(self, choice: int) -> None:
        self.step(self.pull())

    def _again(self, choice: int) -> None:
        if self.pulled:
            self.step(self.pulled[choice % len(self.pulled)])

    def _skip(self, choice: int) -> None:
        self.pull()

    def _reiterate(self, choice: int) -> None:
        self.stream = iter(self.loader)

    def _other(self, choice: int) -> None:
        self.step(self.pull("other"))

    def _add_group(self, choice: int) -> None:
        extra = nn.Parameter(torch.zeros(2, dtype=torch.float64))
        extra.grad = torch.ones_like(extra)  # as left by the user's own backward()
        self.outsiders.append(extra)
        self.optimizer.optimizer.add_param_group({"params": [extra]})

    def _unfreeze_and_add(self, choice: int) -> None:
        if self.frozen[0].requires_grad:
            return
        for parameter in self.frozen:
            parameter.requires_grad_(True)
            parameter.grad = torch.ones_like(parameter)
        self.outsiders.extend(self.frozen)
        self.optimizer.optimizer.add_param_group({"params": self.frozen})

    def _remove_group(self, choice: int) -> None:
        groups = self.optimizer.optimizer.param_groups
        if len(groups) > self.groups:
            removed = groups.pop()
            if removed["params"][0] is self.frozen[0]:
                for parameter in self.frozen:
                    parameter.requires_grad_(False)
                    parameter.grad = None

    def _freeze(self, choice: int) -> None:
        self.trainable[choice % len(self.trainable)].requires_grad_(False)

    def _unfreeze(self, choice: int) -> None:
        for parameter in self.trainable:
            parameter.requires_grad_(True)

    def _sigma(self, choice: int) -> None:
        self.optimizer.dp.noise_multiplier = SIGMAS[choice % len(SIGMAS)]

    def _save(self, choice: int) -> None:
        ok, state = self.call(self.optimizer.state_dict)
        if ok:
            model = {k: v.clone() for k, v in self.model.state_dict().items()}
            self.saved.append((model, copy.deepcopy(state), self.expected.state_dict()))

    def _load(self, choice: int) -> None:
        if not self.saved or len(self.optimizer.optimizer.param_groups) != self.groups:
            return  # torch's optimizer refuses other parameter groups (checkpoint code's test)
        model, state, expected = self.saved[choice % len(self.saved)]
        self.model.load_state_dict(model)
        ok, _ = self.call(lambda: self.optimizer.load_state_dict(copy.deepcopy(state)))
        if ok:
            self.expected = PrivacyLedger.from_state_dict(expected)
            self.stream = iter(self.loader)  # the loader continues after the saved lots


def _same(before: Any, after: Any) -> bool:
    try:
        assert_same(before, after)
    except AssertionError:
        return False
    return True


ACTIONS = (
    "again",
    "skip",
    "reiterate",
    "other",
    "add_group",
    "unfreeze_and_add",
    *["remove_group"] * 2,
    "freeze",
    *["unfreeze"] * 2,
    *["sigma"] * 2,
    "save",
    *["load"] * 3,
)

#: An action, its choice (which micro-batch, parameter, sigma or saved state), then that many
#: micro-batches stepped in order (so that runs go on between misuses and steps are recorded).
PLAN = st.lists(
    st.tuples(st.sampled_from(ACTIONS), st.integers(0, 99), st.integers(0, 4)),
    min_size=4,
    max_size=16,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PLAN)
def test_every_misuse_is_refused_unchanged_or_recorded_exactly(
    plan: list[tuple[str, int, int]],
) -> None:
    loop = Loop()
    for name, choice, then in plan:
        loop.act(name, choice)
        for _ in range(then):
            loop.act("next", 0)
    # Whatever happened, the ledger holds the noisy steps that ran, lot after lot.
    assert loop.optimizer.ledger == loop.expected


def test_the_misuse_suite_sees_steps_and_refusals() -> None:
    """The invariant is exercised on both sides: steps that run and calls that are refused."""
    loop = Loop()
    for name, choice in [("next", 0)] * 12 + [("again", 0), ("add_group", 0), ("next", 0)]:
        loop.act(name, choice)
    assert loop.ran >= 3 and loop.refused >= 2
    assert loop.optimizer.ledger.steps == loop.ran
