"""Tiny models built by the libraries people train with (transformers, peft), random weights.

GPT-2, BERT, Llama, ViT, RoBERTa, DistilBERT, and LoRA adapters (peft) on BERT and Llama.

Each entry builds a float64 model from the library's own config class (no download), a lot of
inputs and targets for it, and the per-example loss the training loop would use: a causal LM's
mean next-token cross-entropy over its logits, a classifier's cross-entropy. The BERT lots carry
an ``attention_mask`` with a different amount of padding per example.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional

__all__ = ["LIBRARY_MODELS", "LibraryModel"]

VOCABULARY = 64
LENGTH = 9
CLASSES = 3


def lm_loss(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
    """Per-example mean cross-entropy of a causal LM's ``logits`` ``(batch, T, vocabulary)``."""
    logits = outputs.logits
    tokens = functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    return tokens.view(targets.shape).mean(1)


def classifier_loss(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy of a sequence classifier's ``logits`` ``(batch, classes)``."""
    return functional.cross_entropy(outputs.logits, targets, reduction="none")


def _tokens(size: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, VOCABULARY, (size, LENGTH), generator=generator)


def lm_lot(size: int, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"input_ids": _tokens(size, generator)}, _tokens(size, generator)


def classifier_lot(size: int, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Tokens with an attention mask padding the last ``i % 4`` positions of example i."""
    generator = torch.Generator().manual_seed(seed)
    tokens = _tokens(size, generator)
    mask = torch.ones(size, LENGTH, dtype=torch.long)
    for i in range(size):
        if i % 4:
            mask[i, LENGTH - i % 4 :] = 0
    targets = torch.randint(0, CLASSES, (size,), generator=generator)
    return {"input_ids": tokens, "attention_mask": mask}, targets


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCABULARY, n_positions=32)
    return GPT2LMHeadModel(config)


def bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=VOCABULARY,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=32,
        num_labels=CLASSES,
    )
    return BertForSequenceClassification(config)


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCABULARY,
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(config)


def image_lot(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """16 x 16 RGB images and class labels."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(size, 3, 16, 16, generator=generator, dtype=torch.float64)
    return images, torch.randint(0, CLASSES, (size,), generator=generator)


def vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        num_labels=CLASSES,
    )
    return ViTForImageClassification(config)


def roberta() -> nn.Module:
    from transformers import RobertaConfig, RobertaForSequenceClassification

    config = RobertaConfig(
        vocab_size=VOCABULARY,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=40,
        num_labels=CLASSES,
        pad_token_id=1,
    )
    return RobertaForSequenceClassification(config)


def distilbert() -> nn.Module:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    config = DistilBertConfig(
        vocab_size=VOCABULARY,
        dim=32,
        n_layers=2,
        n_heads=2,
        hidden_dim=37,
        max_position_embeddings=32,
        num_labels=CLASSES,
    )
    return DistilBertForSequenceClassification(config)


def lora(base: Callable[[], nn.Module], targets: list[str], task: str) -> Callable[[], nn.Module]:
    """``base`` with rank-4 LoRA adapters on ``targets`` (peft; only adapters and head train)."""

    def build() -> nn.Module:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=4, lora_alpha=8, target_modules=targets, task_type=task, lora_dropout=0.0
        )
        with warnings.catch_warnings():  # peft 0.21 calls a name transformers 5 deprecates
            warnings.filterwarnings(
                "ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning
            )
            return get_peft_model(base(), config)  # type: ignore[no-any-return]

    return build


@dataclasses.dataclass(frozen=True)
class LibraryModel:
    """How to build one library model, a lot for it, and its per-example loss."""

    build: Callable[[], nn.Module]
    lot: Callable[[int, int], tuple[Any, torch.Tensor]]
    loss: Callable[[Any, torch.Tensor], torch.Tensor]

    def model(self, seed: int = 0) -> nn.Module:
        """The model in float64, its weights drawn at ``seed``."""
        torch.manual_seed(seed)
        return self.build().double()


LIBRARY_MODELS = {
    "gpt2": LibraryModel(gpt2, lm_lot, lm_loss),
    "bert": LibraryModel(bert, classifier_lot, classifier_loss),
    "llama": LibraryModel(llama, lm_lot, lm_loss),
    "vit": LibraryModel(vit, image_lot, classifier_loss),
    "roberta": LibraryModel(roberta, classifier_lot, classifier_loss),
    "distilbert": LibraryModel(distilbert, classifier_lot, classifier_loss),
    "lora_bert": LibraryModel(
        lora(bert, ["query", "value"], "SEQ_CLS"), classifier_lot, classifier_loss
    ),
    "lora_llama": LibraryModel(lora(llama, ["q_proj", "v_proj"], "CAUSAL_LM"), lm_lot, lm_loss),
}
