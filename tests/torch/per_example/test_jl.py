"""JL norm estimates: unbiased for ||g||^2 with the chi^2_r spread; JL steps tend to exact ones.

Statistical tests use fixed seeds and state their false-rejection rate (<= 1e-5) under a correct
estimator: M^2 r / ||g||^2 ~ chi^2_r exactly (Bu et al. 2021, Lemma 4.1), as <g, v> ~ N(0, ||g||^2).
"""

from __future__ import annotations

import pytest
import torch
from scipy import stats
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.noise import SeededGaussianNoise
from dpcore.torch.per_example.jl import JLEngine
from dpcore.torch.per_example.vmap import VmapEngine

FALSE_REJECTION = 1e-5


def _setup() -> tuple[nn.Module, torch.Tensor, torch.Tensor, nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()
    inputs = torch.randn(4, 5, dtype=torch.float64)
    targets = torch.tensor([0, 1, 2, 1])
    return model, inputs, targets, nn.CrossEntropyLoss(reduction="none")


@pytest.mark.parametrize("r", [1, 5, 30])
def test_estimates_follow_scaled_chi_square(r: int) -> None:
    """Groups of r projections from one large draw: each group's r M^2/||g||^2 ~ chi^2_r.

    KS test per example at 1e-5 / 4 (Bonferroni over the 4 examples), plus the mean of the
    unbiased estimate by a z-test at the same level.
    """
    model, inputs, targets, loss_fn = _setup()
    exact = VmapEngine(model, max_grad_norm=1.0).clipped_sum(inputs, targets, loss_fn).norms
    groups = 4_000
    engine = JLEngine(
        model, max_grad_norm=1.0, jl_dimension=r * groups, directions=SeededGaussianNoise(r)
    )
    projected = engine.projections(inputs, targets, loss_fn)
    estimates = projected.reshape(groups, r, -1).square().mean(dim=1)  # (groups, batch)
    level = FALSE_REJECTION / 8
    for i in range(inputs.shape[0]):
        scaled = (estimates[:, i] * r / exact[i] ** 2).numpy()
        assert stats.kstest(scaled, stats.chi2(r).cdf).pvalue > level
        ratio = estimates[:, i] / exact[i] ** 2  # mean 1, variance 2 / r
        z = float(ratio.mean() - 1) / (2 / r / groups) ** 0.5
        assert abs(z) < stats.norm.isf(level / 2)


def test_jl_step_converges_to_exact_step() -> None:
    """The clipped sum's error shrinks like r^(-1/2): checked at r = 4, 64, 4096 (seeded)."""
    model, inputs, targets, loss_fn = _setup()
    clip = 0.05
    exact = VmapEngine(model, max_grad_norm=clip).clipped_sum(inputs, targets, loss_fn)
    flat_exact = torch.cat([s.flatten() for s in exact.summed])
    errors = []
    for r in (4, 64, 4096):
        engine = JLEngine(
            model, max_grad_norm=clip, jl_dimension=r, directions=SeededGaussianNoise(1)
        )
        lot = engine.clipped_sum(inputs, targets, loss_fn)
        flat = torch.cat([s.flatten() for s in lot.summed])
        errors.append(float((flat - flat_exact).norm() / flat_exact.norm()))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 0.05


def test_loop_and_vmapped_directions_agree() -> None:
    model, inputs, targets, loss_fn = _setup()
    kwargs = {"max_grad_norm": 0.1, "jl_dimension": 6}
    vmapped = JLEngine(model, directions=SeededGaussianNoise(3), **kwargs)
    looped = JLEngine(model, directions=SeededGaussianNoise(3), vmap_directions=False, **kwargs)
    a = vmapped.clipped_sum(inputs, targets, loss_fn)
    b = looped.clipped_sum(inputs, targets, loss_fn)
    torch.testing.assert_close(a.norms, b.norms)
    for x, y in zip(a.summed, b.summed, strict=True):
        torch.testing.assert_close(x, y)


def test_dropout_sees_the_same_mask_in_projections_and_backward() -> None:
    """With dropout, r -> large gives the exact clipped sum of the *same* masked network."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Dropout(0.5), nn.Linear(16, 3)).double()
    inputs = torch.randn(3, 5, dtype=torch.float64)
    targets = torch.tensor([0, 1, 2])
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    engine = JLEngine(
        model, max_grad_norm=1e6, jl_dimension=2_000, directions=SeededGaussianNoise(0)
    )
    torch.manual_seed(5)
    lot = engine.clipped_sum(inputs, targets, loss_fn)
    torch.manual_seed(5)
    masked_losses = loss_fn(model(inputs), targets)
    grads = [
        torch.autograd.grad(masked_losses[i], list(model.parameters()), retain_graph=True)
        for i in range(3)
    ]
    norms = torch.stack([torch.sqrt(sum(g.square().sum() for g in row)) for row in grads])
    torch.testing.assert_close(lot.norms, norms, rtol=0.1, atol=0)  # sd 1.6 %: > 6 sd


def test_lstm_forward_mode_works_on_cpu() -> None:
    """oneDNN's LSTM has no forward-mode derivative; the engine disables it around the jvps."""
    torch.manual_seed(0)

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(3, 4, batch_first=True)
            self.head = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.lstm(x)[0][:, -1])

    model = Classifier()
    inputs, targets = torch.randn(5, 6, 3), torch.randint(0, 2, (5,))
    lot = JLEngine(model, max_grad_norm=1.0, jl_dimension=3).clipped_sum(
        inputs, targets, nn.CrossEntropyLoss(reduction="none")
    )
    assert bool(torch.isfinite(lot.norms).all())
    assert torch._C._get_mkldnn_enabled()  # restored afterwards


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_bad_jl_dimension(bad: object) -> None:
    model, *_ = _setup()
    with pytest.raises(InvalidParameterError, match="Expected jl_dimension"):
        JLEngine(model, max_grad_norm=1.0, jl_dimension=bad)  # type: ignore[arg-type]
