"""The positions audit: its premise (sensitivity at lot == T) and its plumbing, on small runs."""

from __future__ import annotations

import dataclasses

import torch

from audits import dpsgd_positions
from audits.dpsgd_positions import PositionModel, PositionsConfig, ShapeTrustingEngine
from dpcore.torch.per_example.fast import FastEngine

CONFIG = PositionsConfig()


def _swap_distance(engine_class: type[FastEngine]) -> float:
    """||S(lot with canary) - S(lot with a real example instead)||, both lots of exactly T."""
    torch.manual_seed(0)
    model = PositionModel(CONFIG)
    tokens = dpsgd_positions._data(CONFIG, 0)
    with torch.no_grad():
        labels = model(tokens).argmax(1)
    canary, canary_label = dpsgd_positions._canary(model, CONFIG)
    engine = engine_class(model, max_grad_norm=CONFIG.max_grad_norm)
    engine.prepare(tokens[:16], labels[:16], dpsgd_positions._loss)
    keep = CONFIG.length - 1
    with_canary = engine.clipped_sum(
        torch.cat([tokens[:keep], canary]),
        torch.cat([labels[:keep], canary_label]),
        dpsgd_positions._loss,
    )
    without = engine.clipped_sum(tokens[: keep + 1], labels[: keep + 1], dpsgd_positions._loss)
    return float((with_canary.summed[0] - without.summed[0]).norm())


def test_replacing_one_example_moves_the_sum_by_at_most_2c_and_the_planted_bug_more() -> None:
    assert _swap_distance(FastEngine) <= 2 * CONFIG.max_grad_norm + 1e-9
    assert _swap_distance(ShapeTrustingEngine) > 2 * CONFIG.max_grad_norm


def test_scores_of_a_correct_engine_are_the_claimed_gaussians() -> None:
    config = dataclasses.replace(CONFIG, steps=150)
    with dpsgd_positions.single_thread():
        inside = dpsgd_positions.step_scores(config, FastEngine, sigma=0.5, insert=True, seed=1)
        outside = dpsgd_positions.step_scores(config, FastEngine, sigma=0.5, insert=False, seed=2)
    # The canary is clipped to C along its own direction: mean <= 1; sd 0.5, standard error 0.04.
    assert 0.8 <= inside.mean() <= 1.0 + 0.2
    assert abs(outside.mean()) <= 0.2
    assert 0.4 <= outside.std() <= 0.6
