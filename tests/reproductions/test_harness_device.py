from __future__ import annotations

import pytest
import torch

from dpcore.errors import InvalidParameterError
from reproductions.bu2021_jl import config
from reproductions.harness.device import DEVICE_VARIABLE, default_device


def test_the_variable_picks_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICE_VARIABLE, " CPU ")
    assert default_device() == "cpu"
    monkeypatch.setenv(DEVICE_VARIABLE, "cuda")
    assert default_device() == "cuda"


def test_without_the_variable_cuda_only_where_torch_sees_a_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(DEVICE_VARIABLE, raising=False)
    assert default_device() == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_device() == "cuda"


def test_an_unknown_device_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICE_VARIABLE, "tpu")
    with pytest.raises(InvalidParameterError, match=r"DPCORE_DEVICE.*tpu"):
        default_device()


def test_the_jl_reproduction_uses_the_same_choice() -> None:
    assert config.default_device is default_device and config.DEVICE_VARIABLE == DEVICE_VARIABLE
