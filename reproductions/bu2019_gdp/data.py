"""The four datasets of Bu, Dong, Long, Su (2019/2020), Sec. 5, as in-memory tensors.

Every loader returns a :class:`TaskData`: training inputs and targets (what DP-SGD samples from;
one row is one privacy unit) and test inputs and targets.

- MNIST: 60,000 / 10,000 images scaled to [0, 1], ``(n, 1, 28, 28)`` float32, labels 0-9.
- IMDb: 25,000 / 25,000 reviews as ``(n, 256)`` int64 ids of the 10,000 most frequent training
  words (the paper's vocabulary size and length, Sec. 5.2; our tokeniser and vocabulary are
  :func:`dpcore.data.text.imdb_sequences`', built from the training split only, not Keras'
  pre-tokenised copy), labels 0/1.
- Adult: the UCI split (32,561 / 16,281) as :func:`dpcore.data.adult_features`: numeric
  attributes standardised with training statistics (capital gain/loss through log1p first),
  categorical ones one-hot (categories seen in training), ``fnlwgt`` dropped. The paper used
  LIBSVM's 123 binary features and 29,305 training rows (Sec. 5.3); ours are a different encoding
  of the same attributes.
- MovieLens: the paper uses MovieLens-1M (Sec. 5.4); no registry here carries it, so
  MovieLens-100K (943 users, 1,682 movies, 100,000 ratings) is a labelled substitute. Ratings are
  split 80/20 at random with a fixed seed, as the paper does for ML-1M; inputs are ``(user,
  item)`` 0-based id pairs, targets the star rating minus one (5 classes). **Each rating is one
  record** (rating-level privacy, as in the paper), not each user.

The standardisation statistics and category lists come from the training split and are treated
as public, an unaccounted-for leak shared with the paper's preprocessing.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from dpcore.data.adult import adult_features
from dpcore.data.datasets import load_adult, load_mnist, load_movielens_100k
from dpcore.data.text import imdb_sequences
from dpcore.errors import InvalidParameterError

__all__ = [
    "IMDB_LENGTH",
    "IMDB_VOCABULARY",
    "LOADERS",
    "TaskData",
    "adult",
    "imdb",
    "mnist",
    "movielens",
    "subsample",
]

#: Sec. 5.2: reviews cut/padded to 256 words over the 10,000 most frequent words.
IMDB_VOCABULARY, IMDB_LENGTH = 10_000, 256


@dataclasses.dataclass(frozen=True)
class TaskData:
    """Training and test tensors of one task; ``info`` holds sizes a model needs (ids, widths)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    info: dict[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for x, y, name in (
            (self.x_train, self.y_train, "y_train"),
            (self.x_test, self.y_test, "y_test"),
        ):
            if x.shape[0] != y.shape[0]:
                raise InvalidParameterError(name, f"to have {x.shape[0]} rows", y.shape[0])
        if self.x_train.shape[0] == 0:
            raise InvalidParameterError("x_train", "to have at least one row", 0)


def _labels(y: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(y), dtype=torch.long)


def mnist() -> TaskData:
    """MNIST scaled to [0, 1], ``(n, 1, 28, 28)`` float32 and int64 labels."""
    x_train, y_train = load_mnist("train")
    x_test, y_test = load_mnist("test")

    def images(x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(x.astype(np.float32) / 255.0).reshape(len(x), 1, 28, 28)

    return TaskData(images(x_train), _labels(y_train), images(x_test), _labels(y_test))


def imdb(vocab_size: int = IMDB_VOCABULARY, length: int = IMDB_LENGTH) -> TaskData:
    """IMDb token ids (vocabulary from the training split), labels 0/1."""
    x_train, y_train, x_test, y_test = imdb_sequences(vocab_size=vocab_size, length=length)
    return TaskData(
        torch.as_tensor(x_train, dtype=torch.long),
        _labels(y_train),
        torch.as_tensor(x_test, dtype=torch.long),
        _labels(y_test),
        {"vocab_size": vocab_size},
    )


def adult() -> TaskData:
    """UCI Adult: float32 features (:func:`dpcore.data.adult_features`), labels 1 = income > 50K."""
    train_rows, y_train = load_adult("train")
    test_rows, y_test = load_adult("test")
    train, test = adult_features(train_rows, test_rows)
    return TaskData(
        torch.as_tensor(train, dtype=torch.float32),
        _labels(y_train),
        torch.as_tensor(test, dtype=torch.float32),
        _labels(y_test),
        {"in_features": train.shape[1]},
    )


def movielens(test_fraction: float = 0.2, seed: int = 0) -> TaskData:
    """MovieLens-100K ratings split at random: ``(user, item)`` pairs and rating - 1 (0-4).

    Users and items are renumbered 0 ... count - 1 over all ratings (the catalogue is public).
    """
    if not 0.0 < test_fraction < 1.0:
        raise InvalidParameterError("test_fraction", "in (0, 1)", test_fraction)
    ratings = np.asarray(load_movielens_100k())
    if ratings.ndim != 2 or ratings.shape[1] < 3 or len(ratings) < 2:
        raise InvalidParameterError(
            "ratings", "(n >= 2, >= 3) rows (user, item, rating)", ratings.shape
        )
    stars = ratings[:, 2]
    if np.any(stars != np.round(stars)) or stars.min() < 1 or stars.max() > 5:
        raise InvalidParameterError("ratings", "whole stars 1 ... 5", (stars.min(), stars.max()))
    _, users = np.unique(ratings[:, 0], return_inverse=True)
    _, items = np.unique(ratings[:, 1], return_inverse=True)
    pairs = torch.as_tensor(np.stack([users, items], axis=1), dtype=torch.long)
    targets = torch.as_tensor(stars.astype(np.int64) - 1)
    order = torch.as_tensor(np.random.default_rng(seed).permutation(len(ratings)))
    test_count = max(1, round(test_fraction * len(ratings)))
    test, train = order[:test_count], order[test_count:]
    return TaskData(
        pairs[train],
        targets[train],
        pairs[test],
        targets[test],
        {"users": int(users.max()) + 1, "items": int(items.max()) + 1},
    )


def subsample(data: TaskData, *, train: int | None, test: int | None, seed: int) -> TaskData:
    """A random subset of ``train`` training and ``test`` test rows (None keeps all).

    >>> full = TaskData(torch.arange(10.0), torch.arange(10), torch.zeros(4), torch.zeros(4))
    >>> part = subsample(full, train=3, test=None, seed=0)
    >>> len(part.x_train), len(part.x_test), bool((part.x_train == part.y_train).all())
    (3, 4, True)
    """
    generator = torch.Generator().manual_seed(seed)

    def pick(
        x: torch.Tensor, y: torch.Tensor, size: int | None, name: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if size is None:
            return x, y
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidParameterError(name, "a positive integer or None", size)
        if size >= len(x):
            return x, y
        index = torch.randperm(len(x), generator=generator)[:size].sort().values
        return x[index], y[index]

    x_train, y_train = pick(data.x_train, data.y_train, train, "train")
    x_test, y_test = pick(data.x_test, data.y_test, test, "test")
    return TaskData(x_train, y_train, x_test, y_test, dict(data.info))


#: dataset name -> loader (names as in the settings' ``dataset`` field).
LOADERS = {"mnist": mnist, "imdb": imdb, "adult": adult, "movielens": movielens}
