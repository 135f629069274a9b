"""What one black-box membership audit trains: the setting, and one run of it (a run spec).

A *setting* fixes everything the runs of an audit share: the 1,000-record MNIST subset, the
model and its initial parameters (worst-case: pre-trained on other records; or random), the
target record (crafted or natural), DP-SGD's sampling rate, steps, learning rate and clipping
norm. A *run* (:class:`BlackBoxRun`) adds the claimed epsilon, the world (the target in the
training set or not) and the run's seed; it is a frozen dataclass of JSON values, so it keys a
run store.
"""

from __future__ import annotations

import dataclasses
import math

from dpcore.errors import InvalidParameterError
from dpcore.validation import check_count, check_delta, check_positive, check_seed

__all__ = [
    "IMPLEMENTATIONS",
    "INITS",
    "MODELS",
    "TARGETS",
    "WORLDS",
    "BlackBoxRun",
    "BlackBoxSetting",
    "check_run",
    "check_setting",
]

#: Initial parameters: pre-trained (non-privately, on MNIST records outside the subset) so that
#: the subset's gradients are small, or the model's random initialisation (seeded).
INITS = ("worst_case", "random")
#: The target record: an all-zero image, an all-one image, a real image with a wrong label, a
#: real image with its own label (the last two drawn from MNIST's test split).
TARGETS = ("blank", "constant", "mislabelled", "natural")
#: Multinomial logistic regression; one hidden layer of ``hidden`` ReLU units; or the MNIST CNN
#: of the TensorFlow Privacy tutorial that the reproductions train (Bu et al. 2019, Sec. 5.1;
#: :func:`dpcore.torch.models.tf_privacy_mnist_cnn`, its dense layer ``hidden`` units wide:
#: 26,010 parameters at the tutorial's 32).
MODELS = ("linear", "mlp", "cnn")
#: Who trains a run: dpcore's ``DPTrainer.dp_sgd``, or Opacus 1.6's ``PrivacyEngine``.
IMPLEMENTATIONS = ("dpcore", "opacus")
#: The target is in the training set ("in") or not ("out").
WORLDS = ("in", "out")


@dataclasses.dataclass(frozen=True)
class BlackBoxSetting:
    """Everything the runs of one audit share (see the module docstring).

    ``name`` labels the setting in results; ``seed`` fixes the subset, the pre-training records,
    the initial parameters and the natural / mislabelled target, so every run of the setting
    starts from the same parameters.
    """

    name: str = "worst-case init, blank target, full batch"
    subset_size: int = 1000
    model: str = "linear"
    hidden: int = 32
    init: str = "worst_case"
    pretrain_size: int = 10_000
    pretrain_steps: int = 200
    target: str = "blank"
    target_label: int = 0
    sampling_probability: float = 1.0
    steps: int = 50
    lr: float = 1.0
    max_grad_norm: float = 1.0
    delta: float = 1e-5
    seed: int = 0
    implementation: str = "dpcore"


@dataclasses.dataclass(frozen=True)
class BlackBoxRun:
    """One training: ``setting`` at the claim ``epsilon``, in ``world``, with run seed ``seed``."""

    setting: BlackBoxSetting
    epsilon: float
    world: str
    seed: int


def _choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise InvalidParameterError(name, f"in {list(choices)}", value)
    return value


def check_setting(setting: BlackBoxSetting) -> BlackBoxSetting:
    """Return ``setting`` after checking every field.

    Raises:
        InvalidParameterError: naming the first bad field (a size or step count below 1, a
            learning rate or clipping norm not > 0 and finite, a sampling rate outside (0, 1],
            delta outside (0, 1), a label outside 0..9, an unknown model, init, target or
            implementation).
    """
    if not isinstance(setting, BlackBoxSetting):
        raise InvalidParameterError("setting", "to be a BlackBoxSetting", setting)
    if not isinstance(setting.name, str) or not setting.name:
        raise InvalidParameterError("name", "a non-empty str", setting.name)
    check_count("subset_size", setting.subset_size, minimum=1)
    _choice("model", setting.model, MODELS)
    check_count("hidden", setting.hidden, minimum=1)
    _choice("init", setting.init, INITS)
    check_count("pretrain_size", setting.pretrain_size, minimum=1)
    check_count("pretrain_steps", setting.pretrain_steps)
    _choice("target", setting.target, TARGETS)
    label = check_count("target_label", setting.target_label)
    if label > 9:
        raise InvalidParameterError("target_label", "in 0..9", label)
    q = setting.sampling_probability
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q <= 1:
        raise InvalidParameterError("sampling_probability", "in (0, 1]", q)
    check_count("steps", setting.steps, minimum=1)
    for name in ("lr", "max_grad_norm"):
        value = check_positive(name, getattr(setting, name))
        if not math.isfinite(value):
            raise InvalidParameterError(name, "finite", value)
    check_delta("delta", setting.delta)
    check_seed("seed", setting.seed)
    _choice("implementation", setting.implementation, IMPLEMENTATIONS)
    return setting


def check_run(run: BlackBoxRun) -> BlackBoxRun:
    """Return ``run`` after checking it and its setting.

    Raises:
        InvalidParameterError: a bad setting field (see :func:`check_setting`), an epsilon not
            > 0 and finite, a world other than "in" / "out", or a seed outside [0, 2**63).
    """
    if not isinstance(run, BlackBoxRun):
        raise InvalidParameterError("run", "to be a BlackBoxRun", run)
    check_setting(run.setting)
    epsilon = check_positive("epsilon", run.epsilon)
    if not math.isfinite(epsilon):
        raise InvalidParameterError("epsilon", "finite", epsilon)
    _choice("world", run.world, WORLDS)
    check_seed("seed", run.seed)
    return run
