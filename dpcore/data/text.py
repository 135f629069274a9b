"""Word-level tokenisation for the IMDb reviews: a vocabulary from the training split only.

Keras's ``imdb.load_data`` ships pre-tokenised ids whose vocabulary was built by the dataset's
authors from both splits; ours is built from the 25,000 *training* reviews alone (the test split
never influences the model), so sequences are close to, not the same as, Keras's.

Ids: 0 = padding, 1 = out of vocabulary, 2 ... ``vocab_size - 1`` = the most frequent training
words (ties broken alphabetically, so the vocabulary is deterministic). Like Keras's
``pad_sequences`` defaults, sequences are truncated and padded at the *front* (the end of a review
is kept).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from dpcore.errors import InvalidParameterError
from dpcore.validation import check_allocation

__all__ = ["OOV", "PAD", "Vocabulary", "build_vocabulary", "encode", "imdb_sequences", "tokenize"]

PAD, OOV = 0, 1
_TAG = re.compile(r"<[^>]*>")
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")


def tokenize(text: str) -> list[str]:
    """Lower-case words (letters, digits, inner apostrophes); HTML tags such as ``<br />`` dropped.

    Example:
        >>> tokenize("A <br />great film -- isn't it? 10/10")
        ['a', 'great', 'film', "isn't", 'it', '10', '10']
    """
    if not isinstance(text, str):
        raise InvalidParameterError("text", "a str", type(text).__name__)
    return _WORD.findall(_TAG.sub(" ", text.lower()))


def _texts(texts: Iterable[str]) -> list[str]:
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Iterable):
        raise InvalidParameterError("texts", "an iterable of str", type(texts).__name__)
    items = list(texts)
    for index, text in enumerate(items):
        if not isinstance(text, str):
            raise InvalidParameterError(f"texts[{index}]", "a str", type(text).__name__)
    return items


class Vocabulary(dict[str, int]):
    """word -> id, ids 2 ... size - 1 (0 and 1 are reserved for padding and unknown words)."""

    @property
    def size(self) -> int:
        """Number of ids including the two reserved ones (the embedding's row count)."""
        return len(self) + 2


def build_vocabulary(texts: Iterable[str], vocab_size: int) -> Vocabulary:
    """The ``vocab_size - 2`` most frequent words of ``texts`` (count desc., then alphabetical).

    Example:
        >>> vocab = build_vocabulary(["b a a", "c b a"], vocab_size=4)
        >>> dict(vocab), vocab.size
        ({'a': 2, 'b': 3}, 4)
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 3:
        raise InvalidParameterError("vocab_size", "an integer >= 3", vocab_size)
    texts = _texts(texts)
    counts = Counter(word for text in texts for word in tokenize(text))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: vocab_size - 2]
    return Vocabulary({word: index + 2 for index, (word, _) in enumerate(ranked)})


def encode(texts: Sequence[str], vocabulary: Vocabulary, length: int) -> np.ndarray:
    """``(len(texts), length)`` int64 ids, truncated and left-padded with 0 (Keras's defaults).

    Example:
        >>> encode(["a b zzz", "b"], build_vocabulary(["a a b"], 4), length=4).tolist()
        [[0, 2, 3, 1], [0, 0, 0, 3]]
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise InvalidParameterError("length", "an integer >= 1", length)
    texts = _texts(texts)
    if not isinstance(vocabulary, Mapping):
        raise InvalidParameterError("vocabulary", "a mapping word -> id", type(vocabulary).__name__)
    check_allocation("length", length, elements=float(len(texts)) * length)
    out = np.zeros((len(texts), length), dtype=np.int64)
    for row, text in enumerate(texts):
        ids = [vocabulary.get(word, OOV) for word in tokenize(text)][-length:]
        if ids:
            out[row, length - len(ids) :] = ids
    return out


def imdb_sequences(
    vocab_size: int = 8000, length: int = 150
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """IMDb as ``(x_train, y_train, x_test, y_test)`` ids; the vocabulary from training text only.

    Defaults are the DP-SGD-JL paper's (Bu et al. 2021, §5: 8,000 words, length 150).
    """
    from dpcore.data.datasets import load_imdb

    train_text, y_train = load_imdb("train")
    test_text, y_test = load_imdb("test")
    vocabulary = build_vocabulary(train_text, vocab_size)
    return (
        encode(train_text, vocabulary, length),
        y_train,
        encode(test_text, vocabulary, length),
        y_test,
    )
