"""Global torch switches held by overlapping blocks on threads are restored by the last one out.

Runs fanned out on a thread pool (Dask's threads) enter the engines' switch blocks at the same
time; saving, setting and restoring per block left oneDNN off and TF32 replaced for good when
two blocks overlapped (A in, B in, A out, B out), which broke later LSTM and precision checks.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import pytest
import torch

from dpcore.torch.forward_mode import _attention_in_elementary_ops
from dpcore.torch.layers import native_rnn_kernel
from dpcore.torch.per_example.fast import _ieee_float32
from dpcore.torch.switches import switched


def _overlap(block: Callable[[], contextlib.AbstractContextManager[None]]) -> None:
    """Thread A enters, B enters, A leaves, then B leaves: the order that broke restoring."""
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with block():
            a_in.set()
            b_in.wait()
        a_out.set()

    def second() -> None:
        a_in.wait()
        with block():
            b_in.set()
            a_out.wait()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_overlapping_blocks_restore_the_setting() -> None:
    state = {"value": "user"}

    def block() -> contextlib.AbstractContextManager[None]:
        return switched("test", lambda: state["value"], lambda v: state.update(value=v), "ours")

    _overlap(block)
    assert state["value"] == "user"


def test_blocks_wanting_opposite_values_cannot_overlap() -> None:
    state = {"value": 0}
    get, set_ = (lambda: state["value"]), (lambda v: state.update(value=v))
    holding = switched("opposite", get, set_, 1)
    with (
        holding,
        pytest.raises(RuntimeError, match="held at 1"),
        switched("opposite", get, set_, 2),
    ):
        pass  # pragma: no cover - refused on entry
    assert state["value"] == 0


def test_onednn_is_back_on_after_overlapping_native_kernel_blocks() -> None:
    assert torch._C._get_mkldnn_enabled()
    _overlap(native_rnn_kernel)
    assert torch._C._get_mkldnn_enabled()


def test_float32_precision_is_restored_after_overlapping_reference_blocks() -> None:
    before = torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision
    _overlap(_ieee_float32)
    after = torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision
    assert after == before


def test_attention_kernels_are_restored_after_overlapping_forward_mode_blocks() -> None:
    def flags() -> tuple[bool, ...]:
        return (
            torch.backends.mha.get_fastpath_enabled(),
            torch._C._get_flash_sdp_enabled(),
            torch._C._get_mem_efficient_sdp_enabled(),
            torch._C._get_math_sdp_enabled(),
        )

    before = flags()
    inside: list[tuple[bool, ...]] = []

    @contextlib.contextmanager
    def block() -> contextlib.Generator[None]:
        with _attention_in_elementary_ops():
            inside.append(flags())
            yield

    _overlap(block)
    assert flags() == before
    assert inside == [(False, False, False, True)] * 2
