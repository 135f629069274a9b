"""Tokenisation of review text into padded id sequences."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.data.text import OOV, PAD, build_vocabulary, encode, tokenize
from dpcore.errors import InvalidParameterError


def test_tokenize_drops_markup_and_keeps_contractions() -> None:
    assert tokenize("It's <br /><br />GREAT, wasn't it?") == ["it's", "great", "wasn't", "it"]
    assert tokenize("") == []


def test_vocabulary_ranks_by_count_then_alphabetically() -> None:
    vocab = build_vocabulary(["z z z y y x w", "w"], vocab_size=5)
    assert dict(vocab) == {"z": 2, "w": 3, "y": 4}
    assert vocab.size == 5
    assert min(vocab.values()) == 2  # 0 and 1 stay reserved


def test_encode_truncates_front_and_pads_front() -> None:
    vocab = build_vocabulary(["a b c d"], vocab_size=6)
    ids = encode(["a b c d", "d", "unknown words only", ""], vocab, length=3)
    assert ids.dtype == np.int64
    assert ids.tolist() == [
        [vocab["b"], vocab["c"], vocab["d"]],  # the end of the text is kept
        [PAD, PAD, vocab["d"]],
        [OOV, OOV, OOV],
        [PAD, PAD, PAD],
    ]


def test_ids_stay_below_the_vocabulary_size() -> None:
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(50)]
    texts = [" ".join(rng.choice(words, size=20)) for _ in range(30)]
    vocab = build_vocabulary(texts, vocab_size=10)
    assert encode(texts, vocab, length=25).max() < vocab.size


@pytest.mark.parametrize("size", [2, 0, 2.5, True])
def test_bad_vocabulary_size(size: object) -> None:
    with pytest.raises(InvalidParameterError, match="vocab_size"):
        build_vocabulary(["a"], vocab_size=size)  # type: ignore[arg-type]


@pytest.mark.parametrize("length", [0, -1, 1.0])
def test_bad_length(length: object) -> None:
    with pytest.raises(InvalidParameterError, match="length"):
        encode(["a"], build_vocabulary(["a"], 3), length=length)  # type: ignore[arg-type]
