"""Hydraulis' offline dynamic program (`planners/hydraulis_pool.py`) against brute force: on a
small world with few length buckets, T[world][b] is the least makespan over every split of the
buckets up to b into intervals, each trained by d replicas of one type that holds its longest
length, the replicas using exactly the world's ranks (in packs filling the table's rank step)."""
from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest

from ballast.planners import hydraulis_pool
from ballast.planners.hydraulis_pool import Table, _interval_costs, pipeline_types, rank_step
from ballast.pricing.cost import tokens_array
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.model_shape import get_model_shape


def brute_force(types, samples, world: int, unit: int, b_max: int) -> float:
    layouts = list(types)
    lengths = tokens_array(samples).astype(np.int64)
    step = max(1, math.ceil(int(lengths.max()) / hydraulis_pool.BUCKETS))
    bucket = (lengths - 1) // step + 1
    B = int(bucket.max())
    costs = [_interval_costs(types[k], k.pp, samples, bucket, B) for k in layouts]
    caps = [types[k].max_tokens(1, 0.0) for k in layouts]

    def longest(lo, hi):
        inside = lengths[(bucket > lo) & (bucket <= hi)]
        return int(inside.max()) if inside.size else 0

    @functools.lru_cache(maxsize=None)
    def best(ranks: int, hi: int) -> float:
        if hi == 0:
            return 0.0 if ranks == 0 else math.inf
        out = math.inf
        for lo in range(hi):
            for k, layout in enumerate(layouts):
                size = layout.tp * layout.pp
                if caps[k] < longest(lo, hi):
                    continue
                for d in range(1, ranks // size + 1):
                    if (d * size) % unit:  # replicas fill whole rank steps
                        continue
                    out = min(out, max(best(ranks - d * size, lo), costs[k][lo, hi] / d))
        return out

    return best(world, b_max)


def setting(world: int, seed: int):
    cluster = get_cluster(f"h100-{world}")
    types = pipeline_types("analytic", get_model_shape("gpt-7b"), cluster)
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(8, 1.2, 60).astype(int) + 1, 12000)
    return types, [int(n) for n in lengths]


@pytest.mark.parametrize("counts, seed", [(64, 0), (64, 1), (2, 2)])
def test_the_table_is_the_least_makespan_of_every_split_and_replica_choice(monkeypatch, counts, seed):
    monkeypatch.setattr(hydraulis_pool, "BUCKETS", 4)
    monkeypatch.setattr(hydraulis_pool, "COUNTS", counts)
    world = 8
    types, samples = setting(world, seed)
    table = Table.of(types, samples, world)
    smallest = min(k.tp * k.pp for k in types)
    unit = rank_step(world, smallest)
    assert table.unit == unit == (smallest if counts == 64 else 4) and smallest < 4
    for b in range(1, table.buckets + 1):
        assert table.best[-1, b] == pytest.approx(brute_force(types, samples, world, unit, b), rel=1e-12)
        # Its strategy covers the world exactly.
        if np.isfinite(table.best[-1, b]):
            assert sum(p.tp * p.pp for p in table.strategy(b).pipelines) == world


def test_a_thousand_ranks_take_a_table_of_at_most_counts_rows():
    assert rank_step(1024, 1) == 16 and rank_step(1024, 32) == 32 and rank_step(8, 1) == 1
    assert rank_step(96, 1) == 2 and rank_step(3072, 1) == 64  # 48 rows each
    assert rank_step(1000, 1) == 8  # 16 does not divide 1,000: 125 rows
