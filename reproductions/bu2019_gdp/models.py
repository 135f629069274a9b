"""The four models of Bu, Dong, Long, Su (2019/2020), "Deep Learning with Gaussian DP", Sec. 5.

The paper describes its architectures in words; the layer widths below are those of the authors'
training scripts as published in the TensorFlow Privacy repository (``tutorials/
mnist_dpsgd_tutorial.py``, ``research/GDP_2019/imdb_tutorial.py``, ``research/GDP_2019/
adult_tutorial.py``, ``tutorials/movielens_tutorial.py``); the same descriptions are recorded
in :mod:`reproductions.bu2019_gdp.settings` (``Setting.model``).

- MNIST (Sec. 5.1): the TensorFlow Privacy tutorial CNN, two convolutions and two dense layers,
  :func:`dpcore.torch.models.tf_privacy_mnist_cnn` (26,010 parameters).
- IMDb (Sec. 5.2): embedding of the 10,000 most frequent words into 16 dimensions, a global
  average over the 256 positions, a dense layer of 16 ReLU units and 2 logits
  (160,306 parameters).
- Adult (Sec. 5.3): one hidden layer of 16 ReLU units on 123 binary features and 2 logits
  (2,018 parameters at 123 inputs; our one-hot/standardised features have a different width).
- MovieLens (Sec. 5.4): a neural collaborative-filtering model (He et al. 2017, "NeuMF" without
  hidden MLP layers): a 5-dimensional generalised matrix factorisation (element-wise product of
  user and item embeddings) concatenated with 10-dimensional user and item embeddings, then one
  dense layer to 5 logits, one per star rating; the prediction is the expected rating under the
  softmax (146,320 parameters for MovieLens-1M's 6,040 users and 3,706 movies).

Every trainable layer is a Linear, Conv2d or Embedding, so :class:`~dpcore.torch.per_example.
fast.FastEngine` clips exactly at about the cost of one backward. None has BatchNorm.
"""

from __future__ import annotations

import torch
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.models import tf_privacy_mnist_cnn
from dpcore.validation import check_count

__all__ = [
    "NeuralCF",
    "TextAverage",
    "adult_mlp",
    "build_model",
    "imdb_model",
    "mnist_cnn",
    "movielens_ncf",
    "parameter_count",
]


def parameter_count(model: nn.Module) -> int:
    """Number of trainable parameters.

    >>> parameter_count(adult_mlp(123))
    2018
    """
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def mnist_cnn() -> nn.Sequential:
    """The TensorFlow Privacy tutorial CNN used in Sec. 5.1 (26,010 parameters).

    >>> parameter_count(mnist_cnn())
    26010
    """
    return tf_privacy_mnist_cnn()


class TextAverage(nn.Module):
    """Embedding -> mean over all positions (padding included, as Keras' GlobalAveragePooling1D
    without a mask) -> Dense + ReLU -> Dense to ``classes`` logits.

    Args:
        vocab_size: rows of the embedding (token ids must be below it).
        embedding_dim: width of the embedding.
        hidden: width of the hidden dense layer.
        classes: number of logits.
    """

    def __init__(
        self, vocab_size: int, embedding_dim: int = 16, hidden: int = 16, classes: int = 2
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(
            check_count("vocab_size", vocab_size, minimum=1), embedding_dim
        )
        self.hidden = nn.Linear(embedding_dim, check_count("hidden", hidden, minimum=1))
        self.activation = nn.ReLU()
        self.output = nn.Linear(hidden, check_count("classes", classes, minimum=1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(batch, time)`` token ids -> ``(batch, classes)`` logits."""
        pooled = self.embedding(tokens).mean(dim=1)
        logits: torch.Tensor = self.output(self.activation(self.hidden(pooled)))
        return logits


def imdb_model(vocab_size: int = 10_000) -> TextAverage:
    """Sec. 5.2's IMDb model: Embedding(10,000, 16), average, Dense(16) ReLU, Dense(2).

    >>> parameter_count(imdb_model())
    160306
    """
    return TextAverage(vocab_size, 16, 16, 2)


def adult_mlp(in_features: int, hidden: int = 16) -> nn.Sequential:
    """Sec. 5.3's Adult model: ``in_features`` -> 16 ReLU -> 2 logits."""
    in_features = check_count("in_features", in_features, minimum=1)
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, 2))


class NeuralCF(nn.Module):
    """GMF (element-wise product of ``mf_dim``-wide embeddings) concatenated with ``mlp_dim``-wide
    user and item embeddings, then one dense layer to ``ratings`` logits (Sec. 5.4).

    Input: ``(batch, 2)`` int64 rows ``(user, item)``, both 0-based. Output: ``(batch, ratings)``
    logits; :func:`expected_rating` turns them into a prediction on the 1 ... ``ratings`` scale.
    """

    def __init__(
        self, users: int, items: int, *, mf_dim: int = 5, mlp_dim: int = 10, ratings: int = 5
    ) -> None:
        super().__init__()
        users = check_count("users", users, minimum=1)
        items = check_count("items", items, minimum=1)
        self.mf_user = nn.Embedding(users, mf_dim)
        self.mf_item = nn.Embedding(items, mf_dim)
        self.mlp_user = nn.Embedding(users, mlp_dim)
        self.mlp_item = nn.Embedding(items, mlp_dim)
        self.output = nn.Linear(mf_dim + 2 * mlp_dim, check_count("ratings", ratings, minimum=2))

    def forward(self, pairs: torch.Tensor) -> torch.Tensor:
        """``(batch, 2)`` (user, item) ids -> ``(batch, ratings)`` logits."""
        user, item = pairs[:, 0], pairs[:, 1]
        gmf = self.mf_user(user) * self.mf_item(item)
        features = torch.cat([gmf, self.mlp_user(user), self.mlp_item(item)], dim=1)
        logits: torch.Tensor = self.output(features)
        return logits


def movielens_ncf(users: int = 6040, items: int = 3706) -> NeuralCF:
    """Sec. 5.4's recommender; defaults are MovieLens-1M's 6,040 users and 3,706 rated movies.

    >>> parameter_count(movielens_ncf())
    146320
    """
    return NeuralCF(users, items)


def build_model(dataset: str, info: dict[str, int]) -> nn.Module:
    """The model of ``dataset``, sized from the data's ``info`` (vocabulary, width, id counts)."""
    if dataset == "mnist":
        return mnist_cnn()
    if dataset == "imdb":
        return imdb_model(info.get("vocab_size", 10_000))
    if dataset == "adult":
        return adult_mlp(info["in_features"])
    if dataset == "movielens":
        return movielens_ncf(info["users"], info["items"])
    raise InvalidParameterError("dataset", "in ('mnist', 'imdb', 'adult', 'movielens')", dataset)
