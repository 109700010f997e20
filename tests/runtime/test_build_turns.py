"""The ranks of a host build the model in turns (`runtime/build_turns.py`): given a `ModelBuild`,
`parallelize` lets as many ranks build it whole at once as the host's memory holds, each keeping
its stage's part and TP shard before the next turn builds; a `StrategyExecutor` builds its model
of record so, each rank cutting its canonical shards.

On CPU no host is short of memory for the tiny GPT, so the test makes it so (the available bytes
say one model fits) and checks what the turns decide: no two ranks' builds overlap in time, and
the executors hold the weights of one build, the model's own (every part from its pool's first
rank, which built it alike). The host's real peak is not measured here."""
from __future__ import annotations

import functools
import time

import pytest
import torch
import torch.distributed as dist
from runtime_cases import SHAPE

from ballast.models import build_model
from ballast.pricing.device_memory import ParameterCounts
from ballast.runtime import ModelBuild, parallelize, run_local
from ballast.runtime import build_turns
from ballast.runtime.build_turns import BuildTurns, turns_for
from ballast.runtime.strategy import StrategyExecutor
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.job_mesh import JobMesh

GB = 10 ** 9


def test_turns_take_as_many_ranks_as_the_hosts_memory_holds_models():
    assert turns_for(70 * GB, 8, None) == BuildTurns(8, 1)  # memory unknown: all at once
    assert turns_for(10 ** 6, 8, 64 * GB) == BuildTurns(8, 1)  # small against the host
    # Llama-3-70B (280 GB in fp32) on a 2 TB node of eight GPUs: 5 at a time (0.8 x 2 TB / 280 GB).
    assert turns_for(70 * GB, 8, 2000 * GB) == BuildTurns(5, 2)
    assert turns_for(70 * GB, 8, 100 * GB) == BuildTurns(1, 8)  # less than one model: still one at a time
    assert [BuildTurns(3, 3).size * turn for turn in range(3)] == [0, 3, 6]


def _timed_build(built: list[tuple[float, float]], weights: bool = True):
    start = time.monotonic()
    model = build_model(SHAPE, 0, weights=weights)
    if weights:  # the whole builds on the host, long enough that overlapping turns would show
        time.sleep(0.1)
        built.append((start, time.monotonic()))
    return model


def _worker(one_at_a_time: bool, strategy: bool) -> dict:
    torch.set_num_threads(1)
    if one_at_a_time:  # the host holds one whole model, not two
        one = build_turns.BYTES_PER_PARAMETER * ParameterCounts.of_shape(SHAPE).total
        build_turns.available_host_bytes = lambda: int(one * 1.5 / build_turns.HOST_SHARE)
    built: list[tuple[float, float]] = []
    build = functools.partial(_timed_build, built)
    cluster = get_cluster("cpu", world_size=dist.get_world_size())
    if strategy:  # the model of record, cut into the canonical shards
        executor = StrategyExecutor(build, cluster, lr=1e-3)
    else:
        executor = parallelize(ModelBuild(SHAPE, build), cluster, mesh=JobMesh.of(cluster, tp=2, pp=2, shape=SHAPE),
                               lr=1e-3)
    return dict(built=built, weights=executor.state_on_host())


@pytest.mark.slow
@pytest.mark.parametrize("one_at_a_time, strategy", [(True, False), (False, False), (True, True)])
def test_ranks_build_in_turns_and_hold_one_builds_weights(one_at_a_time, strategy):
    ranks = run_local(4, _worker, one_at_a_time, strategy, timeout=180)
    spans = sorted(span for out in ranks for span in out["built"])
    assert len(spans) == 4  # every rank built once
    if one_at_a_time:
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans
    # TP 2 x PP 2 (or the canonical shards): rank 0's host gets every parameter whole, each
    # shard from its own rank's build, equal to the model built in one process.
    whole = {name: p.detach() for name, p in build_model(SHAPE, 0).named_parameters()}
    got = ranks[0]["weights"]
    assert list(got) == list(whole) and all(torch.equal(got[n], whole[n]) for n in whole)
    assert all(out["weights"] == {} for out in ranks[1:])
