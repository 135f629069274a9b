"""Resumable runs of the Abadi et al. 2016 reproduction: a JSON state beside a ``torch.save`` file.

A run's checkpoint is ``<base>.json`` (rows so far, whether the run finished, what it was run
with) and ``<base>.pt`` (model, optimizer, sampler and noise state, e.g. from
:meth:`dpcore.torch.training.DPTrainer.save_checkpoint`). A state is used only when its
``fingerprint`` equals the current run's, so a changed setting starts afresh instead of mixing
two runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def load_state(base: Path | None, fingerprint: dict[str, Any]) -> dict[str, Any] | None:
    """The saved state at ``base`` if it exists and was written for ``fingerprint``.

    The fingerprint is compared after a JSON round trip (tuples become lists).
    """
    if base is None:
        return None
    path = base.with_suffix(".json")
    if not path.is_file():
        return None
    state: dict[str, Any] = json.loads(path.read_text())
    if state.get("fingerprint") != json.loads(json.dumps(fingerprint, default=str)):
        return None
    if not state.get("done") and not base.with_suffix(".pt").is_file():
        return None
    return state


def save_state(
    base: Path, state: dict[str, Any], save_pt: Callable[[Path], None] | None = None
) -> None:
    """Write ``<base>.pt`` (via ``save_pt``) and then ``<base>.json``, each atomically."""
    base.parent.mkdir(parents=True, exist_ok=True)
    if save_pt is not None:
        save_pt(base.with_suffix(".pt"))
    target = base.with_suffix(".json")
    temporary = target.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(state, indent=1, sort_keys=True, default=str) + "\n")
    temporary.replace(target)
