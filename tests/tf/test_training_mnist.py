"""Slow: the TensorFlow engine trains the TF Privacy tutorial CNN on MNIST as well as the torch
engine does: same sigma, C, q, learning rate and epochs, test accuracy within 1 point.

Settings from the TF Privacy tutorial (``mnist_dpsgd_tutorial``: sigma = 1.1, C = 1, SGD lr
0.15, lots of 250 of 60,000) but 3 epochs instead of 60 and Poisson lots of expected size 250.
Needs the MNIST download (``dpcore.data.load_mnist``).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import torch
from torch import nn

from dpcore.data import load_mnist
from dpcore.tf import DPModel, PoissonLots
from dpcore.torch.models import tf_privacy_mnist_cnn
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from tests.tf.models import tf_privacy_cnn

SIGMA, CLIP, LOT, LR, EPOCHS = 1.1, 1.0, 250, 0.15, 3


def _tensorflow_accuracy(train: tuple, test: tuple) -> float:
    keras.utils.set_random_seed(0)
    model = DPModel(tf_privacy_cnn(), max_grad_norm=CLIP, noise_multiplier=SIGMA, seed=0)
    model.compile(
        optimizer=keras.optimizers.SGD(LR),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    lots = PoissonLots(train, expected_lot_size=LOT, seed=0)
    model.fit(lots, epochs=EPOCHS, verbose=0)
    assert model.clipping_method == "ghost" and model.ledger.steps == EPOCHS * 240
    return float(model.evaluate(*test, verbose=0, return_dict=True)["accuracy"])


def _torch_accuracy(train: tuple, test: tuple) -> float:
    torch.manual_seed(0)
    images = torch.from_numpy(train[0]).permute(0, 3, 1, 2).contiguous()
    trainer = DPTrainer.dp_sgd(
        tf_privacy_mnist_cnn(),
        lr=LR,
        inputs=images,
        targets=torch.from_numpy(train[1]),
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        sampler=PoissonSampler(len(train[1]), sampling_probability=LOT / len(train[1]), seed=0),
    )
    trainer.train(steps=EPOCHS * 240, delta=1e-5, progress=False)
    with torch.no_grad():
        logits = trainer.model(torch.from_numpy(test[0]).permute(0, 3, 1, 2).contiguous())
    return float((logits.argmax(1).numpy() == test[1]).mean())


@pytest.mark.slow
def test_tensorflow_engine_matches_the_torch_engine_on_mnist() -> None:
    def prepare(split: str) -> tuple[np.ndarray, np.ndarray]:
        images, labels = load_mnist(split)
        return (images.reshape(-1, 28, 28, 1) / 255.0).astype("float32"), labels.astype("int64")

    train, test = prepare("train"), prepare("test")
    ours, theirs = _tensorflow_accuracy(train, test), _torch_accuracy(train, test)
    print(f"MNIST after {EPOCHS} epochs: TensorFlow {ours:.4f}, torch {theirs:.4f}")
    assert theirs > 0.85
    assert abs(ours - theirs) <= 0.01
