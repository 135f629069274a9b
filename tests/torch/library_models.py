"""The library models of the per-example engine tests: the models benchmark's own recipes
(:mod:`bench.models_zoo`), built at the tests' tiny sizes in float64.

GPT-2, BERT, Llama, ViT, RoBERTa, DistilBERT, LoRA adapters (peft) on BERT and Llama, torch's
``nn.TransformerEncoder`` in a classifier, and timm's families (ResNet-18 with GroupNorm,
ViT-tiny, ConvNeXt, NFNet-F0, NF-ResNet, EfficientNet-B0 with GroupNorm, ResNetV2 BiT). Each is
built from its library's own config (no download), with a lot of inputs and targets and the
per-example loss the training loop would use (:func:`bench.models_zoo.per_example_loss`: a
causal LM's mean next-token cross-entropy, a classifier's cross-entropy). The BERT lots carry an
``attention_mask`` with a different amount of padding per example.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from bench.models_zoo import MODELS, ModelRecipe, Sizes, per_example_loss

__all__ = ["LIBRARY_MODELS", "TINY", "LibraryModel"]

#: The tests' sizes (the benchmark's are :data:`bench.models_zoo.DEFAULT_SIZES`): a feed-forward
#: width that is no multiple of the others, images large enough for timm's five strides of 2.
TINY = Sizes(
    vocabulary=64,
    sequence_length=9,
    width=32,
    heads=2,
    feed_forward=37,
    layers=2,
    classes=3,
    image_size=32,
    patch_size=8,
    lora_rank=4,
)


@dataclasses.dataclass(frozen=True)
class LibraryModel:
    """One recipe of :data:`bench.models_zoo.MODELS` at :data:`TINY` sizes, in float64."""

    recipe: ModelRecipe

    @property
    def library(self) -> str:
        return self.recipe.library

    def installed(self) -> bool:
        """Whether the recipe's library can be imported here."""
        return self.recipe.installed()

    def model(self, seed: int = 0) -> nn.Module:
        """The model in float64, its weights drawn at ``seed``."""
        return self.recipe.model(seed, torch.float64, TINY)  # type: ignore[no-any-return]

    def lot(self, size: int, seed: int) -> tuple[Any, torch.Tensor]:
        """A lot of ``size`` examples drawn at ``seed`` (images in float64)."""
        inputs, targets = self.recipe.make_lot(size, seed, torch.float64, TINY)
        return inputs, targets

    @staticmethod
    def loss(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
        """The per-example loss (:func:`bench.models_zoo.per_example_loss`)."""
        return per_example_loss(outputs, targets)


LIBRARY_MODELS = {name: LibraryModel(recipe) for name, recipe in MODELS.items()}
