"""The library models of the models benchmark (:mod:`bench.models`): small configs, random weights.

Each model is built from its library's own config class (transformers, peft; timm where it is
installed), so nothing is downloaded: BERT, RoBERTa and DistilBERT sequence classifiers (called
with an ``attention_mask`` padding a different number of positions per example), GPT-2, Llama
and OPT causal LMs, a ViT image classifier, rank-4 LoRA adapters (peft) on BERT and Llama,
torch's own ``nn.TransformerEncoder`` under a token embedding and a linear head, and the timm
families people fine-tune with DP: ResNet-18 with GroupNorm, ViT-tiny, ConvNeXt (``LayerNorm2d``,
depthwise convolutions, layer scale), NFNet-F0 and NF-ResNet (``ScaledStdConv2d``: weight
standardisation with a learned gain; no normalization layers), EfficientNet-B0 with GroupNorm
(``GroupNormAct``) and ResNetV2 BiT (``StdConv2d`` and ``GroupNormAct``). Every dropout
probability is 0: a dropout mask is random, and the exactness check compares each method with a
one-example-at-a-time loop on the same function (the timings are alike for every method).

Sizes (:class:`Sizes`, the benchmark's :data:`DEFAULT_SIZES`): width 64, 4 heads, feed-forward
128, 2 layers, sequences of 16 tokens from a vocabulary of 128, 32 x 32 RGB images in 8 x 8
patches, 3 classes. Every recipe takes its sizes, so the tests build the same models smaller
(``tests/torch/library_models.py``). The timm ResNet-18 and ViT-tiny keep their own widths and
depths; the other timm families have one block per stage, widths from ``width`` (ConvNeXt:
``width / 4`` to ``width``), and EfficientNet-B0's channels and depths at a quarter.

The per-example loss of a classifier is the cross-entropy of its logits; of a causal LM, the
mean next-token cross-entropy over the sequence (the privacy unit is the sequence).
:class:`Criterion` is the same loss as a module with a ``reduction`` attribute, which Opacus'
ghost clipping needs.

transformers, peft and timm are imported only inside the functions that build their models.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from dpcore.errors import InvalidParameterError

__all__ = [
    "DEFAULT_SIZES",
    "MODELS",
    "SIZES",
    "Criterion",
    "ModelRecipe",
    "Sizes",
    "per_example_loss",
    "recipe",
]


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The sizes every recipe shares.

    Attributes:
        vocabulary: token ids are drawn from ``range(vocabulary)``.
        sequence_length: tokens per sequence.
        width: hidden size of the transformers; the timm families' widest stage.
        heads: attention heads.
        feed_forward: the transformers' feed-forward width.
        layers: transformer layers.
        classes: classes of the classifiers.
        image_size: side of the square RGB images.
        patch_size: side of the ViTs' patches.
        lora_rank: rank of the LoRA adapters.
    """

    vocabulary: int = 128
    sequence_length: int = 16
    width: int = 64
    heads: int = 4
    feed_forward: int = 128
    layers: int = 2
    classes: int = 3
    image_size: int = 32
    patch_size: int = 8
    lora_rank: int = 4


#: The benchmark's sizes.
DEFAULT_SIZES = Sizes()
#: :data:`DEFAULT_SIZES` and the dropout probability (recorded in the benchmark's JSON).
SIZES = {**dataclasses.asdict(DEFAULT_SIZES), "dropout": 0.0}


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


def _tokens(size: int, generator: torch.Generator, sizes: Sizes) -> torch.Tensor:
    return torch.randint(0, sizes.vocabulary, (size, sizes.sequence_length), generator=generator)


def lm_lot(size: int, seed: int, sizes: Sizes = DEFAULT_SIZES) -> tuple[Any, Any]:
    """``({"input_ids": (size, T)}, next tokens (size, T))``, seeded."""
    generator = torch.Generator().manual_seed(seed)
    return {"input_ids": _tokens(size, generator, sizes)}, _tokens(size, generator, sizes)


def classifier_lot(size: int, seed: int, sizes: Sizes = DEFAULT_SIZES) -> tuple[Any, Any]:
    """Tokens, an attention mask padding the last ``i % 4`` positions of example i, labels."""
    generator = torch.Generator().manual_seed(seed)
    tokens = _tokens(size, generator, sizes)
    length = sizes.sequence_length
    mask = torch.ones(size, length, dtype=torch.long)
    for i in range(size):
        if i % 4:
            mask[i, length - i % 4 :] = 0
    labels = torch.randint(0, sizes.classes, (size,), generator=generator)
    return {"input_ids": tokens, "attention_mask": mask}, labels


def token_lot(size: int, seed: int, sizes: Sizes = DEFAULT_SIZES) -> tuple[Any, Any]:
    """Token ids ``(size, T)`` (a tensor, no mask) and labels: the encoder's lot."""
    generator = torch.Generator().manual_seed(seed)
    tokens = _tokens(size, generator, sizes)
    return tokens, torch.randint(0, sizes.classes, (size,), generator=generator)


def image_lot(size: int, seed: int, sizes: Sizes = DEFAULT_SIZES) -> tuple[Any, Any]:
    """RGB images ``(size, 3, side, side)``, standard normal, and labels."""
    generator = torch.Generator().manual_seed(seed)
    side = sizes.image_size
    images = torch.randn(size, 3, side, side, generator=generator)
    return images, torch.randint(0, sizes.classes, (size,), generator=generator)


# ----------------------------------------------------------------------------- models


def bert(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """``BertForSequenceClassification``."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=sizes.vocabulary,
        hidden_size=sizes.width,
        num_hidden_layers=sizes.layers,
        num_attention_heads=sizes.heads,
        intermediate_size=sizes.feed_forward,
        max_position_embeddings=sizes.sequence_length + 16,
        num_labels=sizes.classes,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config)


def roberta(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """``RobertaForSequenceClassification`` (positions counted from its padding id)."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    config = RobertaConfig(
        vocab_size=sizes.vocabulary,
        hidden_size=sizes.width,
        num_hidden_layers=sizes.layers,
        num_attention_heads=sizes.heads,
        intermediate_size=sizes.feed_forward,
        max_position_embeddings=sizes.sequence_length + 16,
        num_labels=sizes.classes,
        pad_token_id=1,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return RobertaForSequenceClassification(config)


def distilbert(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """``DistilBertForSequenceClassification``."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    config = DistilBertConfig(
        vocab_size=sizes.vocabulary,
        dim=sizes.width,
        n_layers=sizes.layers,
        n_heads=sizes.heads,
        hidden_dim=sizes.feed_forward,
        max_position_embeddings=sizes.sequence_length + 16,
        num_labels=sizes.classes,
        dropout=0.0,
        attention_dropout=0.0,
        seq_classif_dropout=0.0,
    )
    return DistilBertForSequenceClassification(config)


def gpt2(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """``GPT2LMHeadModel`` (its projections are transformers' ``Conv1D``)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=sizes.vocabulary,
        n_embd=sizes.width,
        n_layer=sizes.layers,
        n_head=sizes.heads,
        n_inner=sizes.feed_forward,
        n_positions=sizes.sequence_length + 16,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def llama(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """``LlamaForCausalLM``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=sizes.vocabulary,
        hidden_size=sizes.width,
        intermediate_size=sizes.feed_forward,
        num_hidden_layers=sizes.layers,
        num_attention_heads=sizes.heads,
        num_key_value_heads=sizes.heads,
        max_position_embeddings=sizes.sequence_length + 16,
        attention_dropout=0.0,
    )
    return LlamaForCausalLM(config)


def opt(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """``OPTForCausalLM`` (its feed-forward block runs on the tokens flattened to ``(batch * T,
    d)``)."""
    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(
        vocab_size=sizes.vocabulary,
        hidden_size=sizes.width,
        word_embed_proj_dim=sizes.width,
        ffn_dim=sizes.feed_forward,
        num_hidden_layers=sizes.layers,
        num_attention_heads=sizes.heads,
        max_position_embeddings=sizes.sequence_length + 16,
        dropout=0.0,
        attention_dropout=0.0,
        layerdrop=0.0,
    )
    return OPTForCausalLM(config)


def mixtral(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """``MixtralForCausalLM``: top-2 of 4 experts per token, each expert run on the tokens routed
    to it (the eager experts; the grouped kernel takes no float64)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=sizes.vocabulary,
        hidden_size=sizes.width,
        intermediate_size=sizes.feed_forward,
        num_hidden_layers=sizes.layers,
        num_attention_heads=sizes.heads,
        num_key_value_heads=sizes.heads,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=sizes.sequence_length + 16,
        attention_dropout=0.0,
        experts_implementation="eager",
    )
    return MixtralForCausalLM(config)


def mamba(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """``MambaForCausalLM`` (selective state space; transformers' reference scan on CPU)."""
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(
        vocab_size=sizes.vocabulary,
        hidden_size=sizes.width,
        state_size=4,
        num_hidden_layers=sizes.layers,
        expand=2,
        conv_kernel=3,
    )
    return MambaForCausalLM(config)


def rwkv(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """``RwkvForCausalLM`` (its eval-mode forward writes its state in place, so it
    differentiates in training mode only)."""
    from transformers import RwkvConfig, RwkvForCausalLM

    config = RwkvConfig(
        vocab_size=sizes.vocabulary,
        hidden_size=sizes.width,
        attention_hidden_size=sizes.width,
        intermediate_size=sizes.feed_forward,
        num_hidden_layers=sizes.layers,
        context_length=sizes.sequence_length + 16,
    )
    return RwkvForCausalLM(config)


class RecurrentClassifier(nn.Module):
    """Embedding, a two-layer bidirectional ``nn.GRU`` or ``nn.LSTM``, a linear head on the last
    step (the shape of Opacus' character-level name classifier, with torch's own layers)."""

    def __init__(self, sizes: Sizes = DEFAULT_SIZES, kind: type[nn.RNNBase] = nn.GRU) -> None:
        super().__init__()
        self.embedding = nn.Embedding(sizes.vocabulary, sizes.width)
        self.recurrent = kind(
            sizes.width, sizes.width, num_layers=2, bidirectional=True, batch_first=True
        )
        self.head = nn.Linear(2 * sizes.width, sizes.classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states, _ = self.recurrent(self.embedding(tokens))
        return self.head(states[:, -1])  # type: ignore[no-any-return]


def gru_classifier(sizes: Sizes = DEFAULT_SIZES) -> nn.Module:
    """:class:`RecurrentClassifier` with an ``nn.GRU``."""
    return RecurrentClassifier(sizes, nn.GRU)


def lstm_classifier(sizes: Sizes = DEFAULT_SIZES) -> nn.Module:
    """:class:`RecurrentClassifier` with an ``nn.LSTM``."""
    return RecurrentClassifier(sizes, nn.LSTM)


def vit(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """``ViTForImageClassification``."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=sizes.image_size,
        patch_size=sizes.patch_size,
        num_channels=3,
        hidden_size=sizes.width,
        num_hidden_layers=sizes.layers,
        num_attention_heads=sizes.heads,
        intermediate_size=sizes.feed_forward,
        num_labels=sizes.classes,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return ViTForImageClassification(config)


def _lora(base: Callable[[Sizes], Any], targets: list[str], task: str) -> Callable[[Sizes], Any]:
    def build(sizes: Sizes = DEFAULT_SIZES) -> Any:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=sizes.lora_rank,
            lora_alpha=2 * sizes.lora_rank,
            target_modules=targets,
            task_type=task,
            lora_dropout=0.0,
        )
        with warnings.catch_warnings():  # peft calls a name newer transformers deprecate
            warnings.simplefilter("ignore", FutureWarning)
            return get_peft_model(base(sizes), config)

    build.__doc__ = f"peft LoRA on {base.__name__}'s {targets} (adapters and head train)."
    return build


class EncoderClassifier(nn.Module):
    """Token embedding, ``nn.TransformerEncoder`` (batch first), mean over tokens, linear head."""

    def __init__(self, sizes: Sizes = DEFAULT_SIZES) -> None:
        super().__init__()
        self.embedding = nn.Embedding(sizes.vocabulary, sizes.width)
        layer = nn.TransformerEncoderLayer(
            sizes.width,
            sizes.heads,
            dim_feedforward=sizes.feed_forward,
            dropout=0.0,
            batch_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, sizes.layers, enable_nested_tensor=False)
        self.head = nn.Linear(sizes.width, sizes.classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embedding(tokens)).mean(1))  # type: ignore[no-any-return]


def transformer_encoder(sizes: Sizes = DEFAULT_SIZES) -> nn.Module:
    """:class:`EncoderClassifier`: torch's own ``nn.TransformerEncoder`` in a classifier."""
    return EncoderClassifier(sizes)


#: timm's dropout and stochastic depth (drop path) off: both are random (see the module doc).
_NO_DROP = {"drop_rate": 0.0, "drop_path_rate": 0.0}


def timm_resnet18_gn(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """timm's ResNet-18 with GroupNorm (8 groups; its own widths and depths)."""
    import timm

    def group_norm(channels: int, **_: Any) -> Any:
        return nn.GroupNorm(8, channels)

    return timm.create_model(
        "resnet18", num_classes=sizes.classes, **_NO_DROP, norm_layer=group_norm
    )


def timm_vit_tiny(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """timm's ViT-tiny (its own width and depth) on the images in patches."""
    import timm

    return timm.create_model(
        "vit_tiny_patch16_224",
        img_size=sizes.image_size,
        patch_size=sizes.patch_size,
        num_classes=sizes.classes,
        **_NO_DROP,
    )


def _stage_widths(sizes: Sizes) -> tuple[int, int, int, int]:
    """``width / 4, width / 2, 3 width / 4, width``: four stages' widths."""
    quarter = sizes.width // 4
    return quarter, 2 * quarter, 3 * quarter, 4 * quarter


def timm_convnext(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """timm's ConvNeXt (``convnext_tiny``'s blocks: depthwise 7 x 7 convolution, LayerNorm and a
    Linear MLP channels last, layer scale; ``LayerNorm2d`` in the stem and downsampling), one
    block per stage."""
    import timm

    return timm.create_model(
        "convnext_tiny",
        depths=(1, 1, 1, 1),
        dims=_stage_widths(sizes),
        num_classes=sizes.classes,
        **_NO_DROP,
    )


def timm_nfnet_f0(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """timm's NFNet-F0 (``dm_nfnet_f0``: ``ScaledStdConv2dSame`` with gains, GELU with its
    gamma, squeeze-excite, grouped convolutions), one block per stage, ``skipinit`` off.

    ``skipinit`` (a residual gain initialised to 0) would make every residual branch's weights
    receive no gradient at random weights, so the exactness check would not test them."""
    import timm

    widths = _stage_widths(sizes)
    channels = (*widths[:3], widths[2])  # F0's last two stages are equally wide
    return timm.create_model(
        "dm_nfnet_f0",
        depths=(1, 1, 1, 1),
        channels=channels,
        stem_chs=widths[0],
        group_size=widths[0] // 2,
        num_features=2 * channels[-1],
        skipinit=False,
        num_classes=sizes.classes,
        **_NO_DROP,
    )


def timm_nf_resnet(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """timm's NF-ResNet (``nf_resnet26``: ``ScaledStdConv2d`` with gains, in-place ReLU, no
    normalization layers), one bottleneck block per stage."""
    import timm

    return timm.create_model(
        "nf_resnet26",
        depths=(1, 1, 1, 1),
        channels=_stage_widths(sizes),
        num_classes=sizes.classes,
        **_NO_DROP,
    )


def timm_efficientnet_gn(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """timm's EfficientNet-B0 with GroupNorm (``efficientnet_b0_gn``: ``GroupNormAct`` of 8
    channels a group, in-place SiLU, depthwise convolutions, squeeze-excite) at a quarter of
    B0's channels and depths."""
    import timm

    return timm.create_model(
        "efficientnet_b0_gn",
        channel_multiplier=0.25,
        depth_multiplier=0.25,
        num_classes=sizes.classes,
        **_NO_DROP,
    )


def timm_resnetv2_bit(sizes: Sizes = DEFAULT_SIZES) -> Any:
    """timm's ResNetV2 BiT (``resnetv2_50x1_bit``'s layers: ``StdConv2d``, pre-activation
    ``GroupNormAct`` of 4 channels a group, in-place ReLU), one bottleneck block per stage."""
    from timm.layers import GroupNormAct, StdConv2d
    from timm.models.resnetv2 import ResNetV2

    return ResNetV2(
        layers=[1, 1, 1, 1],
        channels=tuple(2 * width for width in _stage_widths(sizes)),
        stem_chs=sizes.width // 4,
        stem_type="fixed",
        conv_layer=functools.partial(StdConv2d, eps=1e-8),
        norm_layer=functools.partial(GroupNormAct, group_size=4),
        num_classes=sizes.classes,
        **_NO_DROP,
    )


@dataclasses.dataclass(frozen=True)
class ModelRecipe:
    """How to build one model of the benchmark and a lot for it.

    Attributes:
        name: the row's name.
        library: the package that builds it (``transformers``, ``peft``, ``torch``, ``timm``).
        title: what it is, for the table.
        build: ``build(sizes)`` returns the model, its weights drawn from torch's global
            generator.
        lot: ``lot(size, seed, sizes) -> (inputs, targets)``.
    """

    name: str
    library: str
    title: str
    build: Callable[[Sizes], Any]
    lot: Callable[[int, int, Sizes], tuple[Any, Any]]

    def installed(self) -> bool:
        """Whether :attr:`library` (and transformers under peft) can be imported here."""
        needed = [self.library] + (["transformers"] if self.library == "peft" else [])
        return all(importlib.util.find_spec(name) is not None for name in needed)

    def model(self, seed: int = 0, dtype: Any = None, sizes: Sizes = DEFAULT_SIZES) -> Any:
        """The model in training mode, weights drawn at ``seed``, in ``dtype`` (default float32).

        Training mode: Opacus' hooks record nothing in evaluation mode; every dropout is 0, so
        the function is the same.
        """
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model = self.build(sizes)
        return model.to(dtype or torch.float32).train()

    def make_lot(
        self, size: int, seed: int, dtype: Any = None, sizes: Sizes = DEFAULT_SIZES
    ) -> tuple[Any, Any]:
        """``lot(size, seed, sizes)`` with floating inputs cast to ``dtype`` (default float32)."""
        inputs, targets = self.lot(size, seed, sizes)
        if isinstance(inputs, torch.Tensor) and inputs.is_floating_point():
            inputs = inputs.to(dtype or torch.float32)
        return inputs, targets


MODELS: dict[str, ModelRecipe] = {
    recipe.name: recipe
    for recipe in (
        ModelRecipe("bert", "transformers", "BertForSequenceClassification", bert, classifier_lot),
        ModelRecipe("gpt2", "transformers", "GPT2LMHeadModel", gpt2, lm_lot),
        ModelRecipe("llama", "transformers", "LlamaForCausalLM", llama, lm_lot),
        ModelRecipe("opt", "transformers", "OPTForCausalLM", opt, lm_lot),
        ModelRecipe("vit", "transformers", "ViTForImageClassification", vit, image_lot),
        ModelRecipe("mixtral", "transformers", "MixtralForCausalLM (4 experts)", mixtral, lm_lot),
        ModelRecipe("mamba", "transformers", "MambaForCausalLM", mamba, lm_lot),
        ModelRecipe("rwkv", "transformers", "RwkvForCausalLM", rwkv, lm_lot),
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
        ModelRecipe("gru", "torch", "nn.GRU classifier", gru_classifier, token_lot),
        ModelRecipe("lstm", "torch", "nn.LSTM classifier", lstm_classifier, token_lot),
        ModelRecipe(
            "timm_resnet18_gn", "timm", "timm ResNet-18 with GroupNorm", timm_resnet18_gn, image_lot
        ),
        ModelRecipe("timm_vit_tiny", "timm", "timm ViT-tiny", timm_vit_tiny, image_lot),
        ModelRecipe(
            "timm_convnext", "timm", "timm ConvNeXt (1 block a stage)", timm_convnext, image_lot
        ),
        ModelRecipe(
            "timm_nfnet_f0", "timm", "timm NFNet-F0 (1 block a stage)", timm_nfnet_f0, image_lot
        ),
        ModelRecipe(
            "timm_nf_resnet", "timm", "timm NF-ResNet (1 block a stage)", timm_nf_resnet, image_lot
        ),
        ModelRecipe(
            "timm_efficientnet_gn",
            "timm",
            "timm EfficientNet-B0 with GroupNorm (x 0.25)",
            timm_efficientnet_gn,
            image_lot,
        ),
        ModelRecipe(
            "timm_resnetv2_bit",
            "timm",
            "timm ResNetV2 BiT (1 block a stage)",
            timm_resnetv2_bit,
            image_lot,
        ),
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
