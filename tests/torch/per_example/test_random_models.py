"""Property: random small models assembled from the zoo's building blocks, at lot sizes drawn from
the model's own dimensions, are trained exactly by the fast and vmap engines (float64, 1e-10 of a
one-example-at-a-time autograd loop), and the fast path accepts every one of them.
"""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dpcore.torch.engines import make_engine
from tests.torch.reference import loop_clipped_sum, loop_gradients, loop_norms

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")


@dataclasses.dataclass(frozen=True)
class Spec:
    tokens: bool  # token ids (else float features)
    vocabulary: int
    features: int
    length: int
    width: int
    positions: str  # none | embedding | parameter | through_linear
    cls: bool
    prompt: int  # prompt length, 0 for none
    blocks: tuple[str, ...]  # attention | mlp | norm | scale | shared
    tied: bool  # head tied to the token embedding (tokens only)
    classes: int

    def own_dims(self) -> list[int]:
        extra = (1 if self.cls else 0) + self.prompt
        dims = {self.length, self.length + extra, self.width, 2 * self.width, self.classes}
        dims |= {self.vocabulary} if self.tokens else {self.features}
        dims |= {self.prompt} if self.prompt else set()
        return sorted(d for d in dims if d >= 1)


class Assembled(nn.Module):
    def __init__(self, spec: Spec) -> None:
        super().__init__()
        d, dtype = spec.width, torch.float64
        self.spec = spec
        if spec.tokens:
            self.embed: nn.Module = nn.Embedding(spec.vocabulary, d, dtype=dtype)
        else:
            self.embed = nn.Linear(spec.features, d, dtype=dtype)
        if spec.positions == "embedding":
            self.positions = nn.Embedding(spec.length, d, dtype=dtype)
        elif spec.positions in ("parameter", "through_linear"):
            self.table = nn.Parameter(0.3 * torch.randn(spec.length, d, dtype=dtype))
            if spec.positions == "through_linear":
                self.mix = nn.Linear(d, d, dtype=dtype)
        if spec.cls:
            self.cls = nn.Parameter(0.3 * torch.randn(1, 1, d, dtype=dtype))
        if spec.prompt:
            self.prompt = nn.Parameter(0.3 * torch.randn(spec.prompt, d, dtype=dtype))
        layers = nn.ModuleList()
        for kind in spec.blocks:
            if kind == "attention":
                layers.append(nn.ModuleList([nn.Linear(d, d, dtype=dtype) for _ in range(4)]))
            elif kind == "mlp":
                layers.append(
                    nn.Sequential(
                        nn.Linear(d, 2 * d, dtype=dtype),
                        nn.GELU(),
                        nn.Linear(2 * d, d, dtype=dtype),
                    )
                )
            elif kind == "norm":
                layers.append(nn.LayerNorm(d, dtype=dtype))
            elif kind == "scale":
                layers.append(
                    nn.ParameterList([nn.Parameter(1 + 0.3 * torch.randn(d, dtype=dtype))])
                )
            else:  # shared: one Linear applied twice
                layers.append(nn.Linear(d, d, dtype=dtype))
        self.layers = layers
        if spec.tied:
            self.head = nn.Linear(d, spec.vocabulary, bias=False, dtype=dtype)
            self.head.weight = self.embed.weight  # type: ignore[assignment]
        else:
            self.head = nn.Linear(d, spec.classes, dtype=dtype)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        h = self.embed(inputs)
        if spec.positions == "embedding":
            h = h + self.positions(torch.arange(spec.length))
        elif spec.positions == "parameter":
            h = h + self.table
        elif spec.positions == "through_linear":
            h = self.mix(self.table) + h
        batch = h.shape[0]
        front = []
        if spec.cls:
            front.append(self.cls.expand(batch, -1, -1))
        if spec.prompt:
            front.append(self.prompt.unsqueeze(0).expand(batch, -1, -1))
        if front:
            h = torch.cat([*front, h], dim=1)
        for kind, layer in zip(spec.blocks, self.layers, strict=True):
            if kind == "attention":
                query, key, value, out = layer  # type: ignore[misc]
                scores = query(h) @ key(h).transpose(1, 2) / spec.width**0.5
                h = h + out(torch.softmax(scores, dim=-1) @ value(h))
            elif kind == "mlp":
                h = h + layer(h)
            elif kind == "norm":
                h = layer(h)
            elif kind == "scale":
                h = h * layer[0]  # type: ignore[index]
            else:
                h = torch.tanh(layer(torch.tanh(layer(h))))
        return self.head(h.mean(1))

    def make_batch(self, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        spec = self.spec
        generator = torch.Generator().manual_seed(seed)
        if spec.tokens:
            inputs = torch.randint(0, spec.vocabulary, (size, spec.length), generator=generator)
        else:
            inputs = torch.randn(
                size, spec.length, spec.features, generator=generator, dtype=torch.float64
            )
        classes = spec.vocabulary if spec.tied else spec.classes
        return inputs, torch.randint(0, classes, (size,), generator=generator)


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    tokens = draw(st.booleans())
    return Spec(
        tokens=tokens,
        vocabulary=draw(st.integers(2, 6)),
        features=draw(st.integers(1, 5)),
        length=draw(st.integers(1, 5)),
        width=draw(st.integers(1, 5)),
        positions=draw(st.sampled_from(["none", "embedding", "parameter", "through_linear"])),
        cls=draw(st.booleans()),
        prompt=draw(st.integers(0, 3)),
        blocks=tuple(
            draw(
                st.lists(
                    st.sampled_from(["attention", "mlp", "norm", "scale", "shared"]), max_size=3
                )
            )
        ),
        tied=tokens and draw(st.booleans()),
        classes=draw(st.integers(2, 4)),
    )


@settings(max_examples=30, deadline=None)
@given(spec=specs(), data=st.data())
def test_random_models_are_exact_on_fast_and_vmap(spec: Spec, data: st.DataObject) -> None:
    torch.manual_seed(0)
    model = Assembled(spec)
    sizes = data.draw(
        st.lists(st.sampled_from([0, 1, *spec.own_dims()]), min_size=1, max_size=3, unique=True)
    )
    for engine_name in ("fast", "vmap"):
        engine = make_engine(model, engine=engine_name, max_grad_norm=1.0)
        engine.prepare(*model.make_batch(6, seed=1), CROSS_ENTROPY)  # fast accepts every block
        for size in sizes:
            inputs, targets = model.make_batch(size, seed=size)
            lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
            if size == 0:
                assert all(float(s.abs().max()) == 0.0 for s in lot.summed)
                continue
            gradients = loop_gradients(model, inputs, targets, CROSS_ENTROPY)
            torch.testing.assert_close(lot.norms, loop_norms(gradients), atol=1e-10, rtol=0)
            engine.max_grad_norm = float(loop_norms(gradients).median()) or 1.0
            lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
            expected = loop_clipped_sum(gradients, engine.max_grad_norm)
            for found, wanted in zip(lot.summed, expected, strict=True):
                torch.testing.assert_close(found, wanted, atol=1e-10, rtol=0)
