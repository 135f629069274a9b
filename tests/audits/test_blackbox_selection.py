"""Choosing settings by name (``--settings``) and merging their rows into the saved ones."""

from __future__ import annotations

import pytest

from audits.blackbox.selection import chosen, in_profile_order, merged, other_commits
from dpcore.errors import InvalidParameterError

NAMES = ["CNN: full batch", "Opacus CNN: full batch", "Opacus: full batch", "linear"]


def test_a_text_picks_every_name_containing_it_and_a_whole_name_picks_itself_alone() -> None:
    assert chosen(NAMES, None, "p") == [True] * 4
    assert chosen(NAMES, ["CNN"], "p") == [True, True, False, False]
    assert chosen(NAMES, ["opacus"], "p") == [False, True, True, False]
    assert chosen(NAMES, ["cnn: full batch"], "p") == [True, False, False, False]
    assert chosen(NAMES, ["CNN: full batch", "linear"], "p") == [True, False, False, True]


def test_a_text_that_picks_nothing_is_refused_naming_the_settings() -> None:
    with pytest.raises(InvalidParameterError) as refused:
        chosen(NAMES, ["CNN", "ResNet"], "full")
    assert refused.value.parameter == "setting_names"
    assert "ResNet" in str(refused.value) and "Opacus: full batch" in str(refused.value)


def test_new_rows_replace_their_own_and_the_others_keep_their_commit() -> None:
    saved = [
        {"setting_name": "a", "epsilon": 1.0, "x": 1},
        {"setting_name": "b", "epsilon": 1.0, "x": 2, "commit": "old", "created": "2026-01-01"},
    ]
    meta = {"commit": "file", "created": "2026-02-02"}
    new = [{"setting_name": "a", "epsilon": 1.0, "x": 3, "commit": "new", "created": "c"}]
    rows = merged(saved, meta, new)
    assert rows == [saved[1], new[0]]
    assert merged([saved[0]], meta, [])[0]["commit"] == "file"
    lines = other_commits(rows, {"commit": "new"})
    assert lines == ["Rows of b: commit `old`, created 2026-01-01."]
    keyed = merged(saved, meta, [{**new[0], "seed": 1}], key=("setting_name", "epsilon", "x"))
    assert len(keyed) == 3
    # a setting measured at two commits: each line names its claims
    mixed = [*rows, {"setting_name": "b", "epsilon": 2.0, "commit": "new", "created": "c"}]
    lines = other_commits(mixed, {"commit": "new"})
    assert lines == ["Rows of b at ε = 1: commit `old`, created 2026-01-01."]


def test_rows_in_profile_order_settings_then_claims_then_seeds() -> None:
    rows = [
        {"setting_name": "b", "epsilon": 2.0, "seed": 1},
        {"setting_name": "gone", "epsilon": 1.0},
        {"setting_name": "a", "epsilon": 8.0},
        {"setting_name": "b", "epsilon": 2.0, "seed": 0},
        {"setting_name": "b", "epsilon": 1.0, "seed": 3},
    ]
    ordered = in_profile_order(rows, ["a", "b"])
    assert [(r["setting_name"], r["epsilon"], r.get("seed")) for r in ordered] == [
        ("a", 8.0, None),
        ("b", 1.0, 3),
        ("b", 2.0, 0),
        ("b", 2.0, 1),
        ("gone", 1.0, None),
    ]
