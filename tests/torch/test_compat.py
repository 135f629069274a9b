"""Models that mix the examples of a lot are rejected with the module path."""

from __future__ import annotations

import pytest
from torch import nn

from dpcore.torch.compat import check_independent_examples
from dpcore.torch.errors import IncompatibleModelError


@pytest.mark.parametrize("norm", [nn.BatchNorm1d(4), nn.BatchNorm2d(4), nn.SyncBatchNorm(4)])
def test_batch_norm_is_rejected_with_its_path(norm: nn.Module) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), norm))
    with pytest.raises(IncompatibleModelError, match=r"Module '1\.1' is .*BatchNorm.*GroupNorm"):
        check_independent_examples(model)


def test_instance_norm_with_running_stats_is_rejected() -> None:
    with pytest.raises(IncompatibleModelError, match="track_running_stats=False"):
        check_independent_examples(nn.InstanceNorm1d(3, track_running_stats=True))
    check_independent_examples(nn.InstanceNorm1d(3))


def test_independent_models_pass_and_non_modules_fail() -> None:
    check_independent_examples(nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3), nn.GroupNorm(1, 3)))
    with pytest.raises(IncompatibleModelError, match=r"nn\.Module"):
        check_independent_examples("model")  # type: ignore[arg-type]
