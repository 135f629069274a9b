"""The audit task's model, given declaratively so that every framework builds the same one.

A :class:`ModelSpec` is a multi-layer perceptron: layer sizes ``(d, h_1, ..., k)``, a bias in
every layer or none, one activation between layers and a per-example loss (``squared``:
``(z - y)^2 / 2`` with one output; ``cross_entropy``: softmax cross-entropy against an integer
label). Its parameters are a tuple of arrays in torch ``nn.Linear`` order:
``(W_1 (h_1, d), b_1 (h_1,), W_2 (k, h_1), b_2 (k,))`` (no ``b_l`` without biases), and the
parameter *vector* the auditor reads is their concatenation (each flattened row-major).

The auditor evaluates the model here, in float64 numpy: per-example gradients of every tensor
(:func:`per_example_gradients`) and their clipped sums (:func:`clipped_sum`), so that it knows
what a correct DP-SGD step adds at every step of a run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from dpcore.errors import InvalidParameterError

#: Activations between layers.
ACTIVATIONS = ("relu", "tanh", "identity")
#: Per-example losses.
LOSSES = ("squared", "cross_entropy")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """An MLP: ``layers`` = (inputs, hidden..., outputs), biases, activation, loss.

    The linear regression task is ``ModelSpec((d, 1), bias=False, activation="identity")``.
    """

    layers: tuple[int, ...]
    bias: bool = True
    activation: str = "relu"
    loss: str = "squared"

    def __post_init__(self) -> None:
        if len(self.layers) < 2 or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in self.layers
        ):
            raise InvalidParameterError("layers", "at least two integer sizes >= 1", self.layers)
        if self.activation not in ACTIVATIONS:
            raise InvalidParameterError("activation", f"one of {ACTIVATIONS}", self.activation)
        if self.loss not in LOSSES:
            raise InvalidParameterError("loss", f"one of {LOSSES}", self.loss)
        if self.loss == "squared" and self.layers[-1] != 1:
            raise InvalidParameterError("layers", "to end in 1 output for the squared loss", 0)

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """The parameter tensors' shapes, in the canonical order."""
        out: list[tuple[int, ...]] = []
        for fan_in, fan_out in zip(self.layers[:-1], self.layers[1:], strict=True):
            out.append((fan_out, fan_in))
            if self.bias:
                out.append((fan_out,))
        return tuple(out)

    @property
    def names(self) -> tuple[str, ...]:
        """``W1, b1, W2, b2, ...`` in the canonical order."""
        out: list[str] = []
        for layer in range(1, len(self.layers)):
            out.append(f"W{layer}")
            if self.bias:
                out.append(f"b{layer}")
        return tuple(out)

    @property
    def groups(self) -> dict[str, tuple[int, ...]]:
        """Parameter groups as optimizers split them: ``weights`` and (if any) ``biases``."""
        weights = tuple(i for i, n in enumerate(self.names) if n.startswith("W"))
        biases = tuple(i for i, n in enumerate(self.names) if n.startswith("b"))
        return {"weights": weights, "biases": biases} if biases else {"weights": weights}

    @property
    def size(self) -> int:
        """Number of parameters (the length of the parameter vector)."""
        return sum(math.prod(s) for s in self.shapes)

    def offsets(self) -> list[tuple[int, int]]:
        """(start, stop) of each tensor in the parameter vector."""
        out, start = [], 0
        for shape in self.shapes:
            out.append((start, start + math.prod(shape)))
            start += math.prod(shape)
        return out

    def flatten(self, parameters: Sequence[np.ndarray]) -> np.ndarray:
        """The parameter vector (float64) of a tuple in the canonical order (shapes checked)."""
        if len(parameters) != len(self.shapes):
            raise InvalidParameterError(
                "parameters", f"{len(self.shapes)} tensors {self.names}", len(parameters)
            )
        flat = []
        for name, shape, tensor in zip(self.names, self.shapes, parameters, strict=True):
            array = np.asarray(tensor, dtype=np.float64)
            if array.shape != shape:
                raise InvalidParameterError(name, f"of shape {shape}", array.shape)
            flat.append(array.reshape(-1))
        return np.concatenate(flat)

    def unflatten(self, vector: np.ndarray) -> tuple[np.ndarray, ...]:
        """The canonical tuple of a parameter vector."""
        vector = np.asarray(vector)
        if vector.shape != (self.size,):
            raise InvalidParameterError(
                "parameter vector", f"of shape ({self.size},)", vector.shape
            )
        return tuple(
            vector[a:b].reshape(shape)
            for (a, b), shape in zip(self.offsets(), self.shapes, strict=True)
        )


def _activate(spec: ModelSpec, pre: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(activation, its derivative) at ``pre``."""
    if spec.activation == "relu":
        return np.maximum(pre, 0.0), (pre > 0).astype(np.float64)
    if spec.activation == "tanh":
        out = np.tanh(pre)
        return out, 1.0 - out**2
    return pre, np.ones_like(pre)


def forward(spec: ModelSpec, parameters: Sequence[np.ndarray], x: np.ndarray) -> np.ndarray:
    """The model's outputs (n, k) at ``parameters`` (float64)."""
    a = np.asarray(x, dtype=np.float64)
    layers = _layers(spec, parameters)
    for index, (w, b) in enumerate(layers):
        a = a @ w.T + (b if b is not None else 0.0)
        if index < len(layers) - 1:
            a = _activate(spec, a)[0]
    return a


def _layers(
    spec: ModelSpec, parameters: Sequence[np.ndarray]
) -> list[tuple[np.ndarray, np.ndarray | None]]:
    tensors = [np.asarray(p, dtype=np.float64) for p in parameters]
    step = 2 if spec.bias else 1
    return [
        (tensors[i], tensors[i + 1] if spec.bias else None) for i in range(0, len(tensors), step)
    ]


def per_example_gradients(
    spec: ModelSpec, parameters: Sequence[np.ndarray], x: np.ndarray, y: np.ndarray
) -> list[np.ndarray]:
    """Per-example loss gradients, one (n, *shape) array per tensor (canonical order).

    Backpropagation in float64 (the loss of each example is its own, so the gradients are the
    per-example ones DP-SGD clips).
    """
    x = np.asarray(x, dtype=np.float64)
    layers = _layers(spec, parameters)
    inputs, derivatives = [], []
    a = x
    for index, (w, b) in enumerate(layers):
        inputs.append(a)
        pre = a @ w.T + (b if b is not None else 0.0)
        if index < len(layers) - 1:
            a, slope = _activate(spec, pre)
            derivatives.append(slope)
        else:
            a = pre
    if spec.loss == "squared":
        delta = a - np.asarray(y, dtype=np.float64).reshape(-1, 1)
    else:
        shifted = a - a.max(axis=1, keepdims=True)
        probabilities = np.exp(shifted)
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        labels = np.asarray(y).astype(np.int64).reshape(-1)
        probabilities[np.arange(labels.size), labels] -= 1.0
        delta = probabilities
    grads: list[np.ndarray] = []
    for index in range(len(layers) - 1, -1, -1):
        w, _ = layers[index]
        layer_grads = [np.einsum("no,ni->noi", delta, inputs[index])]
        if spec.bias:
            layer_grads.append(delta.copy())
        grads = layer_grads + grads
        if index:
            delta = (delta @ w) * derivatives[index - 1]
    return grads


def clipped_sum(
    spec: ModelSpec,
    parameters: Sequence[np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    max_grad_norm: float,
) -> list[np.ndarray]:
    """Sum of per-example gradients clipped to ``max_grad_norm`` over all tensors together.

    Clip factor min(1, C / ||g||) with ||g|| the norm over every tensor (Abadi et al. 2016);
    an empty batch gives zeros.
    """
    if len(x) == 0:
        return [np.zeros(shape) for shape in spec.shapes]
    grads = per_example_gradients(spec, parameters, x, y)
    squares = sum(np.sum(g.reshape(g.shape[0], -1) ** 2, axis=1) for g in grads)
    factors = np.minimum(1.0, max_grad_norm / np.maximum(np.sqrt(squares), 1e-300))
    return [np.tensordot(factors, g, axes=1) for g in grads]
