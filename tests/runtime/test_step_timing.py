"""What a micro-batch's seconds hold: everything its rank does for it, making its shard included.

`ballast profile` fits the cost model on these seconds, while a step (the bench, `--check`) is
measured by its waves' busy time; work outside the timed region would be in the step and never in
the model (as the 2D video layouts' set-up was: ~1 ms per micro-batch, 10% of a bucket step)."""
from __future__ import annotations

import time

from runtime_cases import LENGTHS, SHAPE

from ballast.vocabulary.cluster import get_cluster
from ballast.models import build_gpt
from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.profile.measure import random_samples
from ballast.runtime import StreamShard, parallelize, run_local

SET_UP_S = 0.05


def _worker() -> tuple[list[float], list[float]]:
    create = StreamShard.create.__func__

    def slow_create(cls, *args, **kwargs):
        time.sleep(SET_UP_S)
        return create(cls, *args, **kwargs)

    StreamShard.create = classmethod(slow_create)
    executor = parallelize(build_gpt(SHAPE, seed=0), get_cluster("cpu", world_size=2), lr=1e-3)
    plan = Plan(LENGTHS, [Wave([Group(0, 2, [MicroBatch(list(range(5))), MicroBatch(list(range(5, 10)))])])])
    result = executor.step(plan, random_samples(LENGTHS, SHAPE.vocab, seed=0))
    return [mb.seconds for mb in result.micro_batches], [w.busy for w in result.waves]


def test_a_micro_batchs_seconds_include_making_its_shard():
    for seconds, busy in run_local(2, _worker, timeout=120):
        assert len(seconds) == 2 and min(seconds) >= SET_UP_S
        # The wave holds little besides its micro-batches (the loop around them).
        assert busy[0] - sum(seconds) < SET_UP_S / 2
