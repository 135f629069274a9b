"""The library models of the models benchmark (:mod:`bench.models`): small configs, random weights.

Each model is built from its library's own config class (transformers, peft; timm where it is
installed), so nothing is downloaded: BERT, RoBERTa and DistilBERT sequence classifiers (called
with an ``attention_mask`` padding a different number of positions per example), GPT-2 and
Llama causal LMs, a ViT image classifier, rank-4 LoRA adapters (peft) on BERT and Llama, and
torch's own ``nn.TransformerEncoder`` under a token embedding and a linear head. Every dropout
probability is 0: a dropout mask is random, and the exactness check compares each method with a
one-example-at-a-time loop on the same function (the timings are alike for every method).

Sizes (:data:`SIZES`): width 64, 4 heads, feed-forward 128, 2 layers, sequences of 16 tokens
from a vocabulary of 128, 32 x 32 RGB images in 8 x 8 patches, 3 classes.

The per-example loss of a classifier is the cross-entropy of its logits; of a causal LM, the
mean next-token cross-entropy over the sequence (the privacy unit is the sequence).
:class:`Criterion` is the same loss as a module with a ``reduction`` attribute, which Opacus'
ghost clipping needs.

transformers, peft and timm are imported only inside the functions that build their models.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from dpcore.errors import InvalidParameterError

__all__ = [
    "MODELS",
    "SIZES",
    "Criterion",
    "ModelRecipe",
    "per_example_loss",
    "recipe",
]

VOCABULARY = 128
LENGTH = 16
WIDTH = 64
HEADS = 4
FEED_FORWARD = 128
LAYERS = 2
CLASSES = 3
IMAGE = 32
PATCH = 8
#: The sizes every recipe shares (recorded in the benchmark's JSON).
SIZES = {
    "vocabulary": VOCABULARY,
    "sequence_length": LENGTH,
    "width": WIDTH,
    "heads": HEADS,
    "feed_forward": FEED_FORWARD,
    "layers": LAYERS,
    "classes": CLASSES,
    "image_size": IMAGE,
    "patch_size": PATCH,
    "lora_rank": 4,
    "dropout": 0.0,
}


# ----------------------------------------------------------------------------- losses


def _logits(outputs: Any) -> Any:
    return outputs.logits if hasattr(outputs, "logits") else outputs


def per_example_loss(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
    """Per-example loss ``(batch,)``: cross-entropy of ``(batch, classes)`` logits, or the mean
    next-token cross-entropy of ``(batch, T, vocabulary)`` logits against ``(batch, T)`` targets.

    ``outputs`` is a tensor of logits or a transformers output with a ``logits`` field.
    """
    logits = _logits(outputs)
    if logits.dim() == 2:
        return functional.cross_entropy(logits, targets, reduction="none")
    tokens = functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    return tokens.view(targets.shape).mean(1)


def mean_loss(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
    """The mean over the lot of :func:`per_example_loss` (the non-private step's loss)."""
    return per_example_loss(outputs, targets).mean()


class Criterion(nn.Module):
    """:func:`per_example_loss` as a module, reduced by its ``reduction`` attribute.

    Opacus' ghost clipping sets ``reduction = "none"`` around its call to get per-example losses.

    Args:
        reduction: ``"none"`` (per-example losses), ``"mean"`` or ``"sum"``.

    Raises:
        InvalidParameterError: ``reduction`` is none of those (at construction or call).
    """

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        _check_reduction(reduction)
        self.reduction = reduction

    def forward(self, outputs: Any, targets: torch.Tensor) -> torch.Tensor:
        losses = per_example_loss(outputs, targets)
        _check_reduction(self.reduction)
        if self.reduction == "sum":
            return losses.sum()
        if self.reduction == "mean":
            return losses.mean()
        return losses


def _check_reduction(reduction: str) -> None:
    if reduction not in ("none", "mean", "sum"):
        raise InvalidParameterError("reduction", "'none', 'mean' or 'sum'", reduction)


# ----------------------------------------------------------------------------- lots


def _tokens(size: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, VOCABULARY, (size, LENGTH), generator=generator)


def lm_lot(size: int, seed: int) -> tuple[Any, Any]:
    """``({"input_ids": (size, T)}, next tokens (size, T))``, seeded."""
    generator = torch.Generator().manual_seed(seed)
    return {"input_ids": _tokens(size, generator)}, _tokens(size, generator)


def classifier_lot(size: int, seed: int) -> tuple[Any, Any]:
    """Tokens, an attention mask padding the last ``i % 4`` positions of example i, labels."""
    generator = torch.Generator().manual_seed(seed)
    tokens = _tokens(size, generator)
    mask = torch.ones(size, LENGTH, dtype=torch.long)
    for i in range(size):
        if i % 4:
            mask[i, LENGTH - i % 4 :] = 0
    labels = torch.randint(0, CLASSES, (size,), generator=generator)
    return {"input_ids": tokens, "attention_mask": mask}, labels


def token_lot(size: int, seed: int) -> tuple[Any, Any]:
    """Token ids ``(size, T)`` (a tensor, no mask) and labels: the encoder's lot."""
    generator = torch.Generator().manual_seed(seed)
    tokens = _tokens(size, generator)
    return tokens, torch.randint(0, CLASSES, (size,), generator=generator)


def image_lot(size: int, seed: int) -> tuple[Any, Any]:
    """RGB images ``(size, 3, 32, 32)``, standard normal, and labels."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(size, 3, IMAGE, IMAGE, generator=generator)
    return images, torch.randint(0, CLASSES, (size,), generator=generator)


# ----------------------------------------------------------------------------- models


def bert() -> Any:
    """``BertForSequenceClassification``."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=VOCABULARY,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FEED_FORWARD,
        max_position_embeddings=LENGTH + 16,
        num_labels=CLASSES,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config)


def roberta() -> Any:
    """``RobertaForSequenceClassification`` (positions counted from its padding id)."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    config = RobertaConfig(
        vocab_size=VOCABULARY,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FEED_FORWARD,
        max_position_embeddings=LENGTH + 16,
        num_labels=CLASSES,
        pad_token_id=1,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return RobertaForSequenceClassification(config)


def distilbert() -> Any:
    """``DistilBertForSequenceClassification``."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    config = DistilBertConfig(
        vocab_size=VOCABULARY,
        dim=WIDTH,
        n_layers=LAYERS,
        n_heads=HEADS,
        hidden_dim=FEED_FORWARD,
        max_position_embeddings=LENGTH + 16,
        num_labels=CLASSES,
        dropout=0.0,
        attention_dropout=0.0,
        seq_classif_dropout=0.0,
    )
    return DistilBertForSequenceClassification(config)


def gpt2() -> Any:
    """``GPT2LMHeadModel`` (its projections are transformers' ``Conv1D``)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCABULARY,
        n_embd=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        n_inner=FEED_FORWARD,
        n_positions=LENGTH + 16,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def llama() -> Any:
    """``LlamaForCausalLM``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCABULARY,
        hidden_size=WIDTH,
        intermediate_size=FEED_FORWARD,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=LENGTH + 16,
        attention_dropout=0.0,
    )
    return LlamaForCausalLM(config)


def vit() -> Any:
    """``ViTForImageClassification``."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=IMAGE,
        patch_size=PATCH,
        num_channels=3,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FEED_FORWARD,
        num_labels=CLASSES,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return ViTForImageClassification(config)


def _lora(base: Callable[[], Any], targets: list[str], task: str) -> Callable[[], Any]:
    def build() -> Any:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=4, lora_alpha=8, target_modules=targets, task_type=task, lora_dropout=0.0
        )
        with warnings.catch_warnings():  # peft calls a name newer transformers deprecate
            warnings.simplefilter("ignore", FutureWarning)
            return get_peft_model(base(), config)

    build.__doc__ = f"peft rank-4 LoRA on {base.__name__}'s {targets} (adapters and head train)."
    return build


class EncoderClassifier(nn.Module):
    """Token embedding, ``nn.TransformerEncoder`` (batch first), mean over tokens, linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, WIDTH)
        layer = nn.TransformerEncoderLayer(
            WIDTH, HEADS, dim_feedforward=FEED_FORWARD, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embedding(tokens)).mean(1))  # type: ignore[no-any-return]


def transformer_encoder() -> nn.Module:
    """:class:`EncoderClassifier`: torch's own ``nn.TransformerEncoder`` in a classifier."""
    return EncoderClassifier()


def timm_resnet18_gn() -> Any:
    """timm's ResNet-18 with GroupNorm (8 groups), 3 classes."""
    import timm

    def group_norm(channels: int, **_: Any) -> Any:
        return nn.GroupNorm(8, channels)

    return timm.create_model("resnet18", num_classes=CLASSES, norm_layer=group_norm)


def timm_vit_tiny() -> Any:
    """timm's ViT-tiny on 32 x 32 images in 8 x 8 patches, 3 classes."""
    import timm

    return timm.create_model(
        "vit_tiny_patch16_224", img_size=IMAGE, patch_size=PATCH, num_classes=CLASSES
    )


@dataclasses.dataclass(frozen=True)
class ModelRecipe:
    """How to build one model of the benchmark and a lot for it.

    Attributes:
        name: the row's name.
        library: the package that builds it (``transformers``, ``peft``, ``torch``, ``timm``).
        title: what it is, for the table.
        build: a function returning the model, its weights drawn from torch's global generator.
        lot: ``lot(size, seed) -> (inputs, targets)``.
    """

    name: str
    library: str
    title: str
    build: Callable[[], Any]
    lot: Callable[[int, int], tuple[Any, Any]]

    def installed(self) -> bool:
        """Whether :attr:`library` (and transformers under peft) can be imported here."""
        needed = [self.library] + (["transformers"] if self.library == "peft" else [])
        return all(importlib.util.find_spec(name) is not None for name in needed)

    def model(self, seed: int = 0, dtype: Any = None) -> Any:
        """The model in training mode, weights drawn at ``seed``, in ``dtype`` (default float32).

        Training mode: Opacus' hooks record nothing in evaluation mode; every dropout is 0, so
        the function is the same.
        """
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model = self.build()
        return model.to(dtype or torch.float32).train()

    def make_lot(self, size: int, seed: int, dtype: Any = None) -> tuple[Any, Any]:
        """``lot(size, seed)`` with floating inputs cast to ``dtype`` (default float32)."""
        inputs, targets = self.lot(size, seed)
        if isinstance(inputs, torch.Tensor) and inputs.is_floating_point():
            inputs = inputs.to(dtype or torch.float32)
        return inputs, targets


MODELS: dict[str, ModelRecipe] = {
    recipe.name: recipe
    for recipe in (
        ModelRecipe("bert", "transformers", "BertForSequenceClassification", bert, classifier_lot),
        ModelRecipe("gpt2", "transformers", "GPT2LMHeadModel", gpt2, lm_lot),
        ModelRecipe("llama", "transformers", "LlamaForCausalLM", llama, lm_lot),
        ModelRecipe("vit", "transformers", "ViTForImageClassification", vit, image_lot),
        ModelRecipe(
            "roberta", "transformers", "RobertaForSequenceClassification", roberta, classifier_lot
        ),
        ModelRecipe(
            "distilbert",
            "transformers",
            "DistilBertForSequenceClassification",
            distilbert,
            classifier_lot,
        ),
        ModelRecipe(
            "lora_bert",
            "peft",
            "LoRA (peft) on BERT",
            _lora(bert, ["query", "value"], "SEQ_CLS"),
            classifier_lot,
        ),
        ModelRecipe(
            "lora_llama",
            "peft",
            "LoRA (peft) on Llama",
            _lora(llama, ["q_proj", "v_proj"], "CAUSAL_LM"),
            lm_lot,
        ),
        ModelRecipe(
            "transformer_encoder",
            "torch",
            "nn.TransformerEncoder",
            transformer_encoder,
            token_lot,
        ),
        ModelRecipe(
            "timm_resnet18_gn", "timm", "timm ResNet-18 with GroupNorm", timm_resnet18_gn, image_lot
        ),
        ModelRecipe("timm_vit_tiny", "timm", "timm ViT-tiny", timm_vit_tiny, image_lot),
    )
}


def recipe(name: str) -> ModelRecipe:
    """The recipe named ``name``.

    Raises:
        InvalidParameterError: no model of :data:`MODELS` has that name.
    """
    if name not in MODELS:
        raise InvalidParameterError("model", f"one of {sorted(MODELS)}", name)
    return MODELS[name]
