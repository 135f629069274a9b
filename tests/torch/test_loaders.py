"""LotLoader: Poisson lots of a map-style Dataset through a DataLoader, in micro-batches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from dpcore.errors import InvalidParameterError, StateError
from dpcore.torch.loaders import LotLoader, LotLoadError, MicroBatch
from dpcore.torch.samplers import PoissonSampler


class Lazy(Dataset[tuple[torch.Tensor, int]]):
    """Examples made on the fly from their index (like images read lazily), with a transform."""

    def __init__(self, size: int, transform: Any = None) -> None:
        self.size, self.transform = size, transform

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.full((1, 2, 2), float(index))
        return (self.transform(image) if self.transform else image), index


def _lots(loader: LotLoader) -> list[list[int]]:
    """Indices of every lot, reassembled from the micro-batches."""
    lots: list[list[int]] = []
    current: list[int] = []
    for micro in loader:
        assert isinstance(micro, MicroBatch)
        if micro.size:
            current += micro.data[1].tolist()
            assert micro.size <= (loader.max_physical_batch_size or micro.size)
        if micro.last:
            assert len(current) == micro.lot_size
            lots.append(current)
            current = []
    assert not current
    return lots


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("physical", [None, 1, 3])
def test_lots_are_the_samplers_lots_in_micro_batches(workers: int, physical: int | None) -> None:
    reference = PoissonSampler(30, sampling_probability=0.05, seed=7)
    expected = [reference.sample().tolist() for _ in range(reference.steps_per_epoch)]
    assert any(len(lot) == 0 for lot in expected)  # empty lots are part of the test
    loader = LotLoader(
        Lazy(30, transform=lambda x: x * 2),
        sampler=PoissonSampler(30, sampling_probability=0.05, seed=7),
        max_physical_batch_size=physical,
        num_workers=workers,
    )
    assert len(loader) == 20
    assert _lots(loader) == expected


def test_empty_lots_yield_one_micro_batch_without_data() -> None:
    loader = LotLoader(Lazy(5), sampler=PoissonSampler(5, sampling_probability=0.01, seed=0))
    micros = list(loader)
    assert len(micros) == 100  # round(1 / q) lots, nearly all empty
    empty = [m for m in micros if m.size == 0]
    assert empty and all(m.data is None and m.last and m.lot_size == 0 for m in empty)


def test_collate_fn_and_dict_examples_pass_through() -> None:
    class Records(Dataset[dict[str, torch.Tensor]]):
        def __len__(self) -> int:
            return 30

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"x": torch.tensor([float(index)]), "y": torch.tensor(index % 2)}

    calls = []

    def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        calls.append(len(items))
        return {k: torch.stack([item[k] for item in items]) for k in items[0]}

    loader = LotLoader(
        Records(),
        sampler=PoissonSampler(30, sampling_probability=0.3, seed=1),
        max_physical_batch_size=4,
        collate_fn=collate,
    )
    micros = [m for m in loader if m.size]
    assert micros and all(set(m.data) == {"x", "y"} for m in micros)
    assert calls and max(calls) <= 4


@pytest.mark.parametrize("workers", [0, 2])
def test_state_dict_resumes_after_the_lots_consumed_not_the_prefetched(workers: int) -> None:
    def loader() -> LotLoader:
        return LotLoader(
            Lazy(50),
            sampler=PoissonSampler(50, sampling_probability=0.1, seed=3),
            max_physical_batch_size=2,
            num_workers=workers,
        )

    whole = _lots(loader())
    first = loader()
    seen: list[list[int]] = []
    current: list[int] = []
    for micro in first:
        if micro.size:
            current += micro.data[1].tolist()
        if micro.last:
            seen.append(current)
            current = []
            if len(seen) == 4:
                break
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert seen + _lots(resumed) == whole


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(10))


def test_bad_inputs_are_refused_with_the_reason() -> None:
    sampler = PoissonSampler(10, sampling_probability=0.5, seed=0)
    data = TensorDataset(torch.zeros(10, 2), torch.zeros(10))
    with pytest.raises(InvalidParameterError, match="IterableDataset has no size"):
        LotLoader(Stream(), sampler=sampler)
    for option, value in (("batch_size", 4), ("shuffle", True), ("drop_last", True)):
        with pytest.raises(InvalidParameterError, match=option):
            LotLoader(data, sampler=sampler, **{option: value})
    with pytest.raises(InvalidParameterError, match="len\\(dataset\\) = 10"):
        LotLoader(data, sampler=PoissonSampler(11, sampling_probability=0.5, seed=0))
    for bad in (0, -3):
        with pytest.raises(InvalidParameterError, match="max_physical_batch_size"):
            LotLoader(data, sampler=sampler, max_physical_batch_size=bad)
    with pytest.raises(InvalidParameterError, match="sampler"):
        LotLoader(data, sampler=DataLoader(data))  # type: ignore[arg-type]


def test_sampling_probability_takes_the_size_from_the_dataset() -> None:
    loader = LotLoader(Lazy(40), sampling_probability=0.1, seed=2)
    reference = PoissonSampler(40, sampling_probability=0.1, seed=2)
    assert _lots(loader) == [reference.sample().tolist() for _ in range(10)]
    with pytest.raises(InvalidParameterError, match="sampler"):
        LotLoader(Lazy(40))
    with pytest.raises(InvalidParameterError, match="sampler"):
        LotLoader(Lazy(40), sampler=reference, sampling_probability=0.1)


def test_pin_memory_passes_through_to_the_data_loader() -> None:
    loader = LotLoader(Lazy(20), sampling_probability=0.5, seed=0, pin_memory=True)
    assert loader.loader.pin_memory
    expected = _lots(LotLoader(Lazy(20), sampling_probability=0.5, seed=0))
    if torch.cuda.is_available():
        assert _lots(loader) == expected
    else:  # torch says it will not pin without an accelerator, and loads as usual
        with pytest.warns(UserWarning, match="pin_memory"):
            assert _lots(loader) == expected


_ORPHAN_CHILD = r"""
import os, sys, time
import torch
from torch.utils.data import Dataset
from dpcore.torch.loaders import LotLoader

folder = sys.argv[1]


class Slow(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        time.sleep(120)  # busy in __getitem__: torch's own watchdog never looks for the parent
        return torch.zeros(1)


def announce(worker_id):
    path = os.path.join(folder, f"worker{worker_id}")
    with open(path + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


loader = LotLoader(Slow(), sampling_probability=0.5, seed=0, num_workers=2, worker_init_fn=announce)
for _ in loader:
    pass
"""


def _exited(pid: int) -> bool:
    """Linux: absent from /proc, or a zombie nobody reaped yet (it runs nothing more)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def test_item9_workers_die_when_their_parent_is_sigkilled(tmp_path: Path) -> None:
    """A process iterating a LotLoader with 2 workers is SIGKILLed while the workers load: within
    a few seconds no worker survives it (it would for minutes: it is busy in __getitem__)."""
    root = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_CHILD, str(tmp_path)], env=env, stderr=subprocess.PIPE
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2:
            assert child.poll() is None, child.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "the workers did not start"
            files = [tmp_path / f"worker{i}" for i in range(2)]
            if all(path.exists() for path in files):
                workers = [int(path.read_text()) for path in files]
            time.sleep(0.05)
        assert all(not _exited(pid) for pid in workers)
        child.kill()
        child.wait()
        deadline = time.monotonic() + 3
        while not all(_exited(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in workers if not _exited(pid)] == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for pid in workers:  # clean up after a failure: these are this test's processes
            if not _exited(pid):
                os.kill(pid, signal.SIGKILL)
        if child.stderr is not None:
            child.stderr.close()


def test_item2_micro_batches_carry_their_index_in_the_lot_and_their_loader() -> None:
    def loader() -> LotLoader:
        sampler = PoissonSampler(30, sampling_probability=0.3, seed=1)
        return LotLoader(Lazy(30), sampler=sampler, max_physical_batch_size=2)

    first = loader()
    micros = list(first)
    indices: dict[int, list[int]] = {}
    for micro in micros:
        indices.setdefault(micro.lot, []).append(micro.index)
    assert all(found == list(range(len(found))) for found in indices.values())
    assert max(len(found) for found in indices.values()) > 1
    assert all(micro.source is first.token for micro in micros)
    assert loader().token is not first.token  # each loader tags its own micro-batches
    assert "source" not in repr(micros[0])
    assert first.lots_consumed == len(first) == 3


class FailsOnce(Lazy):
    """``Lazy`` whose record ``bad`` fails to load once (a marker file, safe across workers)."""

    def __init__(self, size: int, marker: str, bad: int) -> None:
        super().__init__(size)
        self.marker, self.bad = marker, bad

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index == self.bad:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                raise OSError(f"flaky read of record {index}")
        return super().__getitem__(index)


@pytest.mark.parametrize("workers", [0, 2])
def test_item7_a_failed_load_raises_a_typed_error_and_the_lot_is_drawn_again(
    workers: int, tmp_path: Path
) -> None:
    def sampler() -> PoissonSampler:
        return PoissonSampler(30, sampling_probability=0.2, seed=4)

    expected = _lots(LotLoader(Lazy(30), sampler=sampler(), max_physical_batch_size=2))
    flaky = LotLoader(
        FailsOnce(30, str(tmp_path / "failed"), bad=17),  # first drawn in lot 3
        sampler=sampler(),
        max_physical_batch_size=2,
        num_workers=workers,
    )
    seen: list[list[int]] = []
    current: list[int] = []
    with pytest.raises(LotLoadError, match="Loading a micro-batch of lot 3 failed") as caught:
        for micro in flaky:
            if micro.size:
                current += micro.data[1].tolist()
            if micro.last:
                seen.append(current)
                current = []
    assert isinstance(caught.value, StateError) and caught.value.lot == 3
    assert isinstance(caught.value.__cause__, OSError)
    assert seen == expected[:3] and current == [3, 5, 12, 13]  # two micro-batches of lot 3
    assert flaky.lots_consumed == 3  # rewound to the start of lot 3
    assert seen + _lots(flaky) == expected  # lot 3 again, identically, then the rest


def test_default_split_of_dict_batches_and_hints_that_lose_nothing() -> None:
    from dpcore.torch.loaders import SplitByKey, split_pair

    batch = {"input_ids": 1, "attention_mask": 2, "labels": 3}
    assert split_pair(batch) == ({"input_ids": 1, "attention_mask": 2}, 3)
    assert SplitByKey("y")({"x": 1, "y": 2}) == ({"x": 1}, 2)
    with pytest.raises(InvalidParameterError, match=r"tuple\(batch\[:-1\]\), batch\[-1\]"):
        split_pair((1, 2, 3))
    with pytest.raises(InvalidParameterError) as caught:
        SplitByKey("labels")({"x": 1})
    assert caught.value.parameter == "target_key"
    assert "['x']" in str(caught.value)
