"""TF Privacy 0.9 (``DPKerasSGDOptimizer`` + ``model.fit``) behind the audit contract.

TF Privacy installs only beside TensorFlow <= 2.15 and never beside torch, so the training runs
in its own environment (:mod:`audits.implementations.tf_privacy_worker`, one long-lived process
serving tasks over a pipe); this adapter hands it each task and replays the trace into the
observer. The batches are TF Privacy's tutorial usage: ``tf.data`` shuffled each epoch, fixed
size B = round(q N), last partial batch dropped; its claimed epsilon is its own
``compute_dp_sgd_privacy`` (RDP, Poisson sampling at q = B / N assumed). Which records each
step used is read by replaying the same seeded shuffle over the record indices (the structural
tests would show a replay that does not match the trace).
"""

from __future__ import annotations

import math
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dpcore.auditing.implementation import AuditTask, Claim, Observer
from dpcore.errors import DPCoreError

ROOT = Path(__file__).resolve().parents[2]
#: The TF Privacy environment's interpreter (made by ``nox -s audit``); override with the
#: environment variable ``DPCORE_TF_PRIVACY_PYTHON``.
DEFAULT_PYTHON = ROOT / ".nox" / "tf-privacy-worker" / "bin" / "python"


class TfPrivacyUnavailableError(DPCoreError):
    """The TF Privacy environment is missing or its worker failed."""


def python() -> Path:
    """The interpreter of the TF Privacy environment."""
    return Path(os.environ.get("DPCORE_TF_PRIVACY_PYTHON", DEFAULT_PYTHON))


class TfPrivacy:
    """TF Privacy's DP-SGD (its worker process starts on first use; :meth:`close` stops it)."""

    name = "tf_privacy 0.9 (model.fit, shuffled batches)"

    def __init__(self) -> None:
        self._worker: subprocess.Popen[str] | None = None
        self._folder: tempfile.TemporaryDirectory[str] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its worker: each process starts its own when it first trains."""
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def _start(self) -> subprocess.Popen[str]:
        if self._worker is None:
            if not python().exists():
                raise TfPrivacyUnavailableError(
                    f"no TF Privacy environment at {python()} (nox -s audit makes it; or set "
                    "DPCORE_TF_PRIVACY_PYTHON)"
                )
            self._folder = tempfile.TemporaryDirectory(prefix="tf-privacy-audit-")
            self._worker = subprocess.Popen(
                [str(python()), "-m", "audits.implementations.tf_privacy_worker"],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        return self._worker

    def close(self) -> None:
        """Stop the worker."""
        if self._worker is not None:
            assert self._worker.stdin is not None and self._worker.stdout is not None
            self._worker.stdin.close()
            self._worker.wait(timeout=60)
            self._worker.stdout.close()
            self._worker = None
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None

    def train(self, task: AuditTask, observer: Observer) -> Claim:
        worker = self._start()
        assert self._folder is not None
        path = str(Path(self._folder.name) / f"task-{task.seed}-{task.steps}.npz")
        np.savez(
            path,
            features=task.features,
            targets=task.targets,
            initial_weight=task.initial_weight,
            seed=task.seed,
            steps=task.steps,
            batch_size=task.batch_size,
            max_grad_norm=task.max_grad_norm,
            noise_multiplier=task.noise_multiplier,
            learning_rate=task.learning_rate,
            delta=task.delta,
            report_epsilon=task.report_epsilon,
            layers=np.array(task.spec.layers),
            bias=task.spec.bias,
            activation=task.spec.activation,
            loss=task.spec.loss,
        )
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write(path + "\n")
        worker.stdin.flush()
        answer = worker.stdout.readline().strip()
        if not answer.startswith("ok"):
            raise TfPrivacyUnavailableError(f"TF Privacy worker: {answer or 'exited'}")
        result = np.load(path + ".out.npz")
        for weight, lot in zip(result["weights"][1:], result["lots"], strict=True):
            observer.step(weight, lot)
        epsilon = float(result["epsilon"])
        batch = int(result["batch_size"])
        return Claim(
            implementation=self.name,
            sampler="shuffle",
            accounting_assumes="poisson",
            sampling_probability=float(result["sampling_probability"]),
            noise_multiplier=task.noise_multiplier,
            max_grad_norm=task.max_grad_norm,
            steps=task.steps,
            delta=task.delta,
            divisor=float(batch),
            epsilon=None if math.isnan(epsilon) else epsilon,
            accountant="tf_privacy compute_dp_sgd_privacy (RDP)",
        )
