"""Data-parallel DP-SGD / DP-Adam over ``torch.distributed`` (one process per device, ``torchrun``).

Each of the W ranks holds the model replica and the training set, and owns the shard of records
``rank, rank + W, rank + 2W, ...``. Every step:

1. each rank Poisson-samples its shard with the *global* rate q (every record independently, so
   the union of the local lots is one Poisson lot of the whole dataset; a local lot may be empty);
2. each rank computes its local sum of clipped per-example gradients (exact engines);
3. rank 0 alone adds N(0, sigma^2 C^2 I) to its local sum (no rank sees another's sum or noise
   before the reduction);
4. one ``all_reduce(SUM)`` of the flattened sums gives every rank the noisy global sum, divided by
   the global expected lot size q N (Abadi et al. 2016, Alg. 1 over the union lot);
5. every rank takes the same optimizer step, so the replicas stay identical, and records the
   same event (q, sigma) in its ledger.

Why a plain module and an explicit all-reduce rather than ``DistributedDataParallel``: DDP
all-reduces the ``.grad`` that ``backward`` leaves (the mean of *unclipped* gradients), while
DP-SGD needs the sum of clipped per-example gradients, which the engines compute themselves;
wrapping would add a second, wrong all-reduce. A model wrapped in DDP is therefore refused.

At construction every rank checks, in one collective, that all ranks agree on q, sigma, C, the
dataset size, the world size and the model (architecture and parameter values): a mismatch
raises on every rank (no rank is left waiting). Collectives run on a group of their own with a
timeout (``timeout_s``); a rank that stops answering makes the others raise
:class:`DistributedTimeoutError` instead of hanging.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcore.atomic import atomic_path
from dpcore.errors import DPCoreError, InvalidParameterError, StateError
from dpcore.torch.arguments import derived_seed
from dpcore.torch.batches import Batch, batch_size, take
from dpcore.torch.checkpoint import check_ledger, check_model_state, require, seal, verify
from dpcore.torch.engines import make_engine
from dpcore.torch.ledger import PrivacyLedger, training_statement, write_statement
from dpcore.torch.noise import NoiseSource, SeededGaussianNoise, checked_standard_normal
from dpcore.torch.optimizers import DPOptimizer
from dpcore.torch.per_example.base import ClippedBatch, LossFunction, NonFinitePolicy
from dpcore.torch.per_example.jl import JLEngine
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import StepResult
from dpcore.validation import check_positive, check_probability

#: What the ranks must agree on, in the order of the agreement vector.
AGREED = (
    "sampling_probability",
    "noise_multiplier",
    "max_grad_norm",
    "dataset_size",
    "world_size",
    "jl_dimension",
    "engine",
    "model architecture",
    "model parameters",
)


class DistributedTimeoutError(DPCoreError, RuntimeError):
    """A collective did not complete within the trainer's timeout (a rank stopped answering)."""


def _architecture_code(model: nn.Module) -> float:
    """A number that differs between models of different structure (types, names, shapes)."""
    text = "|".join(
        f"{name}:{type(module).__name__}" for name, module in model.named_modules()
    ) + "|".join(f"{n}:{tuple(p.shape)}:{p.requires_grad}" for n, p in model.named_parameters())
    return float(int(hashlib.sha256(text.encode()).hexdigest()[:12], 16))


def _parameter_code(model: nn.Module) -> float:
    """A number that differs between replicas with different parameter values."""
    digest = hashlib.sha256()
    for parameter in model.parameters():
        digest.update(parameter.detach().cpu().contiguous().numpy().tobytes())
    return float(int(digest.hexdigest()[:12], 16))


class AllReduceDPOptimizer(DPOptimizer):
    """:class:`DPOptimizer` whose noisy sum is the all-reduce of the ranks' clipped sums, with
    the noise drawn once, on rank 0 (see the module doc)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        rank: int,
        group: Any,
        device: torch.device,
        **kwargs: Any,
    ) -> None:
        super().__init__(optimizer, **kwargs)
        self.rank = rank
        self.group = group
        self.device = device

    def privatise(self, clipped: ClippedBatch) -> list[torch.Tensor]:
        """``(sum over ranks of S_rank + N(0, sigma^2 C^2 I) drawn on rank 0) / (q N)``.

        Rank 0's draws are checked (:func:`~dpcore.torch.noise.checked_standard_normal`); a
        refusal travels inside the same all-reduce as one extra entry, so every rank raises
        before any parameter moves and none is left waiting in a collective.

        Raises:
            InvalidParameterError: rank 0's noise source returned draws that cannot be the
                step's noise (on rank 0 that error, on the others one naming rank 0).
        """
        if len(clipped.summed) != len(self.engine.parameters):
            raise InvalidParameterError(
                "clipped", f"to hold {len(self.engine.parameters)} sums", len(clipped.summed)
            )
        local = []
        refused: InvalidParameterError | None = None
        for parameter, summed in zip(self.engine.parameters, clipped.summed, strict=True):
            value = summed.detach().to(parameter.dtype).clone()
            if self.rank == 0 and refused is None:
                try:
                    noise = checked_standard_normal(self.noise, parameter)
                except InvalidParameterError as error:
                    refused = error
                else:
                    value = value + self.noise_std * noise
            local.append(value.reshape(-1))
        flag = torch.ones(1, dtype=local[0].dtype if local else torch.float64, device=self.device)
        flat = torch.cat([*local, flag * float(refused is not None)])
        _collective(lambda: dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group))
        if refused is not None:
            raise refused
        if float(flat[-1]) != 0.0:
            raise InvalidParameterError(
                "noise", "valid draws on rank 0", "refused on rank 0 (see its error)"
            )
        noisy, offset = [], 0
        for parameter in self.engine.parameters:
            size = parameter.numel()
            noisy.append(
                flat[offset : offset + size].reshape(parameter.shape) / self.expected_batch_size
            )
            offset += size
        return noisy


def _collective(call: Any) -> Any:
    """Run a collective; a timeout or a peer that died becomes DistributedTimeoutError."""
    try:
        return call()
    except RuntimeError as error:
        raise DistributedTimeoutError(
            f"A collective of the distributed DP trainer failed or timed out ({error}); "
            "another rank probably stopped or raised."
        ) from None


class DistributedDPTrainer:
    """Data-parallel DP training on the current ``torch.distributed`` process group.

    Args:
        model: a plain ``nn.Module`` (not DDP-wrapped), identical on every rank.
        inputs: the whole training set's inputs, identical on every rank (each rank trains on
            its shard ``rank::world_size``); N = its size.
        targets: the training set's targets, identical on every rank.
        loss_fn: per-example losses (``reduction="none"``).
        optimizer: a torch optimizer over the model's trainable parameters.
        noise_multiplier: sigma > 0.
        max_grad_norm: the clipping norm C > 0.
        sampling_probability: q in (0, 1], the global Poisson rate.
        engine: ``"auto"``, ``"fast"``, ``"vmap"``, ``"loop"`` (exact) or ``"jl"`` (DP-SGD-JL with
            ``jl_dimension``: every rank draws the step's r directions from a source seeded
            alike, every step, so all ranks project on the same directions).
        jl_dimension: r for ``engine="jl"``.
        noise: rank 0's noise source (default seeded from ``seed``).
        seed: seeds rank 0's noise (``seed``), the JL directions (``seed + 1``, the same on
            every rank) and each rank's sampler (``seed + 2 + rank``); ``None`` draws them from
            the OS (the directions' seed on rank 0, sent to the others).
        nonfinite: ``"raise"`` or ``"zero"`` for NaN/inf per-example gradients.
        timeout_s: timeout of every collective, in seconds.

    Raises:
        StateError: no initialised process group.
        InvalidParameterError: a DDP-wrapped model, bad q / sigma / C, or ranks that disagree
            (raised on every rank, after one collective, naming what differs or which rank
            had invalid input).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        inputs: Batch,
        targets: Batch,
        loss_fn: LossFunction,
        optimizer: torch.optim.Optimizer,
        noise_multiplier: float,
        max_grad_norm: float,
        sampling_probability: float,
        engine: str = "auto",
        jl_dimension: int | None = None,
        noise: NoiseSource | None = None,
        seed: int | None = None,
        nonfinite: NonFinitePolicy = "raise",
        timeout_s: float = 300.0,
    ) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise StateError(
                "No torch.distributed process group is initialised: call "
                "torch.distributed.init_process_group (torchrun sets its environment) first."
            )
        # Local checks do not raise before the agreement collective: a rank that raised alone
        # would leave the others waiting. Every rank learns there whether all inputs are valid.
        problems: list[InvalidParameterError] = []

        def checked(check: Any, name: str, value: object) -> float:
            try:
                return float(check(name, value))
            except InvalidParameterError as error:
                problems.append(error)
                return math.nan

        if isinstance(model, nn.parallel.DistributedDataParallel):
            problems.append(
                InvalidParameterError(
                    "model",
                    "a plain nn.Module (DDP all-reduces unclipped gradients; this trainer "
                    "all-reduces clipped sums itself)",
                    "a DistributedDataParallel wrapper",
                )
            )
        q = checked(check_probability, "sampling_probability", sampling_probability)
        sigma = checked(check_positive, "noise_multiplier", noise_multiplier)
        c = checked(check_positive, "max_grad_norm", max_grad_norm)
        timeout = check_positive("timeout_s", timeout_s)  # needed before any collective
        size = batch_size(inputs)
        if batch_size(targets, "targets") != size:
            problems.append(
                InvalidParameterError(
                    "targets", f"to have {size} rows like inputs", batch_size(targets, "targets")
                )
            )
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        # NCCL reduces CUDA tensors only: the small agreement and seed tensors go there too
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend() == "nccl"
            else torch.device("cpu")
        )
        self.group = dist.new_group(
            ranks=list(range(self.world_size)), timeout=datetime.timedelta(seconds=timeout)
        )
        self._agree(
            [
                float(not problems),
                q,
                sigma,
                c,
                float(size),
                float(self.world_size),
                float(jl_dimension or 0),
                float(int(hashlib.sha256(engine.encode()).hexdigest()[:12], 16)),
                _architecture_code(model),
                _parameter_code(model),
            ],
            problems,
        )
        self.model, self.inputs, self.targets, self.loss_fn = model, inputs, targets, loss_fn
        self.dataset_size = size
        self.shard = torch.arange(self.rank, size, self.world_size)
        self.sampler = PoissonSampler(
            len(self.shard),
            sampling_probability=q,
            seed=None if seed is None else seed + 2 + self.rank,
        )
        self.engine = make_engine(
            model,
            engine=engine,
            max_grad_norm=c,
            jl_dimension=jl_dimension,
            directions=SeededGaussianNoise(self._shared_seed(seed)),
            nonfinite=nonfinite,
        )
        self.jl_dimension = self.engine.jl_dimension if isinstance(self.engine, JLEngine) else None
        if len(self.shard):
            pool = self.shard[: self.engine.TRIAL_POOL]
            self.engine.prepare(take(inputs, pool), take(targets, pool), loss_fn)
        self.optimizer = AllReduceDPOptimizer(
            optimizer,
            rank=self.rank,
            group=self.group,
            device=self.device,
            engine=self.engine,
            noise_multiplier=sigma,
            expected_batch_size=q * size,
            noise=noise if noise is not None else SeededGaussianNoise(seed),
        )
        self.ledger = PrivacyLedger(dataset_size=size, sampler="poisson")

    def _shared_seed(self, seed: int | None) -> int:
        """The JL directions' seed: ``seed + 1`` (wrapped into [0, 2**63)), or rank 0's draw
        from the OS sent to all."""
        if seed is not None:
            return derived_seed(seed)
        drawn = torch.tensor(
            [int.from_bytes(os.urandom(7), "little")], dtype=torch.int64, device=self.device
        )
        _collective(lambda: dist.broadcast(drawn, src=0, group=self.group))
        return int(drawn[0])

    def _agree(self, values: list[float], problems: list[InvalidParameterError]) -> None:
        """One all-gather: every rank's validity flag and :data:`AGREED` values, compared."""
        mine = torch.tensor(values, dtype=torch.float64, device=self.device)
        every = [torch.zeros_like(mine) for _ in range(self.world_size)]
        _collective(lambda: dist.all_gather(every, mine, group=self.group))
        invalid = [rank for rank, v in enumerate(every) if float(v[0]) != 1.0]
        if problems:
            raise problems[0]
        if invalid:
            raise InvalidParameterError(
                "inputs", "valid on every rank", f"invalid on rank(s) {invalid} (see their errors)"
            )
        for index, name in enumerate(AGREED, start=1):
            seen = [float(v[index]) for v in every]
            if any(value != seen[0] for value in seen):
                shown = f"per rank {seen}" if name in AGREED[:6] else "differs between ranks"
                raise InvalidParameterError(name, "the same on every rank", shown)

    @property
    def expected_lot_size(self) -> float:
        """q N, the global expected lot size (the divisor of the noisy sum)."""
        return self.optimizer.expected_batch_size

    @property
    def sampling_probability(self) -> float:
        """q, the global Poisson rate."""
        return self.sampler.sampling_probability

    @property
    def steps_done(self) -> int:
        """Noisy steps taken so far (the ledger's count, the same on every rank)."""
        return self.ledger.steps

    def step(self) -> StepResult:
        """One step on every rank (a collective: every rank must call it).

        Raises:
            InvalidParameterError: on every rank, before anything changes, when a rank cannot
                take or record the step (parameters added to or frozen in its optimizer since
                construction, a noise multiplier its ledger cannot record): that rank raises its
                own error, the others one naming it (:meth:`_agree_to_step`).
        """
        self._agree_to_step()
        self.model.train()
        local = self.shard[self.sampler.sample()]
        inputs, targets = take(self.inputs, local), take(self.targets, local)
        if isinstance(self.engine, JLEngine):
            with self.engine.drawn_lot():  # the same directions on every rank, every step
                clipped = self.engine.clipped_sum(inputs, targets, self.loss_fn)
        else:
            clipped = self.engine.clipped_sum(inputs, targets, self.loss_fn)
        self.optimizer.step(clipped)
        self.ledger.record(
            sampling_probability=self.sampling_probability,
            noise_multiplier=self.optimizer.noise_multiplier,
            jl_dimension=self.jl_dimension,
        )
        loss = float(clipped.losses.mean()) if len(local) else math.nan
        return StepResult(self.ledger.steps, len(local), loss, math.nan)

    def _agree_to_step(self) -> None:
        """One all-gather of each rank's verdict on the coming step, before any rank changes.

        A rank whose optimizer no longer holds exactly the engine's parameters, or whose ledger
        could not record the step, would otherwise raise alone and leave the others waiting in
        the step's all-reduce; here every rank learns it first and raises.
        """
        problem: DPCoreError | None = None
        try:
            self.optimizer.check_parameters()
            self.ledger.check(
                sampling_probability=self.sampling_probability,
                noise_multiplier=self.optimizer.noise_multiplier,
                jl_dimension=self.jl_dimension,
            )
        except DPCoreError as error:
            problem = error
        mine = torch.tensor([float(problem is not None)], dtype=torch.float64, device=self.device)
        every = [torch.zeros_like(mine) for _ in range(self.world_size)]
        _collective(lambda: dist.all_gather(every, mine, group=self.group))
        if problem is not None:
            raise problem
        refused = [rank for rank, flag in enumerate(every) if float(flag[0]) != 0.0]
        if refused:
            raise InvalidParameterError(
                "step", "possible on every rank", f"refused on rank(s) {refused} (see their errors)"
            )

    def epsilon(self, *, delta: float, accountant: str = "pld") -> float:
        """Epsilon spent so far (every rank holds the same ledger)."""
        return self.ledger.epsilon(delta=delta, accountant=accountant)

    def privacy_statement(
        self, *, delta: float, accountants: tuple[str, ...] = ("rdp", "pld"), **extra: Any
    ) -> dict[str, Any]:
        """The ledger's statement, with the world size."""
        return training_statement(
            self.ledger,
            delta,
            accountants,
            self.optimizer,
            self,
            self.jl_dimension,
            world_size=self.world_size,
            **extra,
        )

    def save_statement(self, path: str | Path, *, delta: float, **extra: Any) -> dict[str, Any]:
        """Rank 0 writes :meth:`privacy_statement` to ``path``; every rank returns it."""
        statement = self.privacy_statement(delta=delta, **extra)
        if self.rank == 0:
            write_statement(path, statement)
        return statement

    def close(self) -> None:
        """Wait for every rank (a barrier), then destroy the trainer's own process group.

        Call it on every rank before ``torch.distributed.destroy_process_group()``: no rank then
        tears its connections down while a peer still uses them, and no collective's work object
        outlives the interpreter (gloo aborts the process when one does).
        """
        _collective(lambda: dist.barrier(group=self.group))
        dist.destroy_process_group(self.group)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str | Path) -> None:
        """Rank 0 writes the model, optimizer, noise, ledger and every rank's sampler state.

        A collective: every rank calls it (the samplers' states are gathered to rank 0). The file
        is written atomically and sealed with an integrity digest
        (:mod:`dpcore.torch.checkpoint`: sha256 of every entry, verified at load; it detects
        corruption and accidental edits, not a deliberate forger).
        """
        samplers: list[Any] = [None] * self.world_size
        state = self.sampler.state_dict()
        _collective(lambda: dist.all_gather_object(samplers, state, group=self.group))
        if self.rank == 0:
            checkpoint = {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "ledger": self.ledger.state_dict(),
                "samplers": samplers,
                "world_size": self.world_size,
            }
            if isinstance(self.engine, JLEngine):
                checkpoint["directions"] = self.engine.directions.state_dict()
            seal(checkpoint)
            with atomic_path(path) as temporary:
                torch.save(checkpoint, temporary)
        _collective(lambda: dist.barrier(group=self.group))

    def load_checkpoint(self, path: str | Path) -> None:
        """Every rank resumes from :meth:`save_checkpoint`'s file (same world size only).

        Every rank checks everything first (integrity digest, world size, model keys and shapes,
        optimizer, noise, its own sampler's state, JL directions, ledger) and assigns only when
        all passed: a refused file changes nothing. The file is the same for every rank, so a
        damaged or foreign one is refused on every rank.

        Raises:
            StateError: a file that is not such a checkpoint, fails its integrity check, was
                written by another world size, or does not fit this trainer.
            FileNotFoundError: no file at ``path``.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"No checkpoint at {path}.")
        try:
            state = torch.load(path, weights_only=True, map_location="cpu")
        except Exception as error:
            raise StateError(f"{path} is not a distributed trainer checkpoint ({error}).") from None
        verify(state, "distributed checkpoint")
        require(state, ("model", "optimizer", "ledger", "samplers", "world_size"), "checkpoint")
        saved_world = state["world_size"]
        if saved_world != self.world_size:
            raise StateError(
                f"{path} was written by {saved_world} ranks; this run has {self.world_size}. "
                "Each rank's Poisson sampler state belongs to its shard, so resume with the "
                "same world size."
            )
        jl = isinstance(self.engine, JLEngine)
        if jl != ("directions" in state):
            raise StateError("The checkpoint's JL directions do not match this trainer's engine.")
        samplers = state["samplers"]
        if not isinstance(samplers, list) or len(samplers) != self.world_size:
            raise StateError(f"Expected {self.world_size} sampler states, got {samplers!r}.")
        try:
            check_model_state(self.model, state["model"])
            self.optimizer.check_state_dict(state["optimizer"])
            self.sampler.check_state_dict(samplers[self.rank])
            if isinstance(self.engine, JLEngine):
                self.engine.directions.check_state_dict(state["directions"])
            ledger = check_ledger(state["ledger"], self.ledger, samplers[self.rank]["lots_drawn"])
        except (KeyError, RuntimeError, TypeError, ValueError, AttributeError) as error:
            if isinstance(error, DPCoreError):
                raise
            raise StateError(f"Checkpoint does not fit this trainer: {error!r}") from None
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.sampler.load_state_dict(samplers[self.rank])
        if isinstance(self.engine, JLEngine):
            self.engine.directions.load_state_dict(state["directions"])
        self.ledger = ledger
