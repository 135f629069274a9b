"""A tiny workload for trying executors and for the docs: a seeded Monte Carlo estimate of pi.

:func:`example_run` is the shape every workload takes (a module-level function of a frozen
spec, returning JSON values); :func:`example_resumable_run` also keeps a checkpoint in its run
folder every ``spec.chunk`` draws, so a run killed part-way resumes where it stopped and ends
with the same result as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

from dpcore.atomic import atomic_write_text
from dpcore.errors import InvalidParameterError

__all__ = ["ExampleSpec", "example_resumable_run", "example_run"]

CHECKPOINT = "checkpoint.json"


@dataclasses.dataclass(frozen=True)
class ExampleSpec:
    """One estimate: ``steps`` points drawn with ``seed``, checkpointed every ``chunk``.

    Raises:
        InvalidParameterError: ``steps`` or ``chunk`` is not a positive int.
    """

    seed: int
    steps: int = 1000
    chunk: int = 100

    def __post_init__(self) -> None:
        for name in ("steps", "chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameterError(name, "an int >= 1", value)


def _draw(generator: random.Random, count: int) -> int:
    inside = 0
    for _ in range(count):
        x, y = generator.random(), generator.random()
        inside += x * x + y * y <= 1.0
    return inside


def example_run(spec: ExampleSpec) -> dict[str, Any]:
    """Estimate pi from ``spec.steps`` seeded draws.

    Example:
        >>> example_run(ExampleSpec(seed=0, steps=1000))
        {'inside': 782, 'pi': 3.128, 'seed': 0, 'steps': 1000}
    """
    inside = _draw(random.Random(spec.seed), spec.steps)
    return {"inside": inside, "pi": 4 * inside / spec.steps, "seed": spec.seed, "steps": spec.steps}


def example_resumable_run(spec: ExampleSpec, folder: Path) -> dict[str, Any]:
    """:func:`example_run`, resuming from the checkpoint in ``folder`` and writing one per chunk.

    The checkpoint holds the draws done, the count inside and the generator's state, written
    atomically, so the result equals :func:`example_run`'s however often the run is killed.
    """
    generator = random.Random(spec.seed)
    done = inside = 0
    path = folder / CHECKPOINT
    if path.is_file():
        saved = json.loads(path.read_text())
        done, inside = int(saved["done"]), int(saved["inside"])
        state = saved["state"]
        generator.setstate((state[0], tuple(state[1]), state[2]))
    while done < spec.steps:
        count = min(spec.chunk, spec.steps - done)
        inside += _draw(generator, count)
        done += count
        saved = {"done": done, "inside": inside, "state": generator.getstate()}
        atomic_write_text(path, json.dumps(saved))
    return {"inside": inside, "pi": 4 * inside / spec.steps, "seed": spec.seed, "steps": spec.steps}
