"""The canonical layout's movement (`pricing/parameter_movement.py`) against hand-worked numbers."""
from __future__ import annotations

import pytest

from ballast.pricing.device_memory import ParameterCounts
from ballast.pricing.parameter_movement import Movement, movement_prices
from ballast.pricing.pipeline import stage_counts
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.model_shape import get_model_shape
from ballast.vocabulary.strategy import Strategy


def test_full_and_sliced_by_hand():
    tiny, cpu = get_model_shape("tiny"), get_cluster("cpu", 8)  # 803,968 parameters, 4 blocks
    strategy = Strategy.parse("2x2,2x1,1x1,1x1")
    m, n = ParameterCounts.of_shape(tiny).total, 8
    calls = (tiny.layers + 1) * cpu.all_to_all_latency
    full = movement_prices(strategy, tiny, cpu)
    # Every rank all-gathers the whole model's fp32 tensors (7/8 of them from its peers), then
    # reduce-scatters their gradients: the same bytes back.
    assert full.bytes_per_rank == pytest.approx(7 / 8 * 4 * m)
    assert full.gather == full.reduction == pytest.approx(7 / 8 * 4 * m / cpu.ring_bandwidth + calls)
    assert full.optimizer == pytest.approx(32 * m / n / cpu.memory_bandwidth)
    # Sliced: a (1,1) rank needs the whole model, the most of any rank; an owner sends its
    # share to one rank of each of the 4 pipelines (4 M / 8 < M).
    sliced = movement_prices(strategy, tiny, cpu, Movement.SLICED)
    assert stage_counts(tiny, 0, 1, 1).total == m
    assert sliced.bytes_per_rank == pytest.approx(7 / 8 * 4 * m)
    # Two (2,2) pipelines: each rank holds a quarter of the model (a TP half of a stage's half,
    # the embedding's or the output layer's half on top), and owners send to 2 ranks: 2 M / 8.
    halves = movement_prices(Strategy.parse("2x2,2x2"), tiny, cpu, Movement.SLICED)
    most = max(stage_counts(tiny, k, 2, 2).total for k in range(2))
    assert m / 4 < most < m / 2
    assert halves.bytes_per_rank == pytest.approx(7 / 8 * 4 * most)
    assert halves.gather < full.gather and halves.total == pytest.approx(2 * halves.gather + halves.optimizer)


def test_one_rank_moves_nothing():
    prices = movement_prices(Strategy.parse("1x1"), get_model_shape("tiny"), get_cluster("cpu", 1))
    assert (prices.gather, prices.reduction, prices.bytes_per_rank) == (0.0, 0.0, 0.0) and prices.optimizer > 0
