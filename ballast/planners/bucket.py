"""`bucket`: Open-Sora's and DCP's bucketing baseline.

Sequences fall into power-of-two length buckets; each bucket has its own batch size (as many
of its longest sequences as fit a micro-batch at the bucket's least recompute level), so
micro-batches hold sequences of similar length. One fixed SP degree (`static`'s), equal
groups in lockstep.
"""
from __future__ import annotations

from collections import defaultdict

from ..plans.plan import Plan
from ..vocabulary.samples import SampleBatch
from .base import Planner
from .packing import deal_by_time, fixed_run, lockstep_wave, micro_batch
from .registry import register


@register
class BucketPlanner(Planner):
    name = "bucket"

    def _plan(self, batch: SampleBatch) -> Plan:
        lengths = batch.lengths
        max_len, degree, run_recompute = fixed_run(self.cost, lengths, self.options.max_len, self.options.degree)
        buckets: dict[int, list[int]] = defaultdict(list)
        for i, s in enumerate(lengths):
            buckets[(s - 1).bit_length()].append(i)
        mbs = []
        for b, ids in sorted(buckets.items()):
            bucket_max = min(1 << b, max_len)
            # The bucket's batch size is set for its longest possible member, as a profiled
            # per-bucket batch size would be; short buckets run without recomputation.
            level = self.cost.min_recompute(bucket_max, degree)
            assert level is not None and level <= run_recompute
            per_mb = max(1, self.cost.max_tokens(degree, level) // bucket_max)
            ids.sort(key=lambda i: -lengths[i])
            for k in range(0, len(ids), per_mb):
                mbs.append(micro_batch(ids[k:k + per_mb], lengths, degree, self.cost, level))
        world = self.cluster.world_size
        per_group = deal_by_time(mbs, batch, degree, self.cost, world // degree)
        wave = lockstep_wave(per_group, batch, degree, self.cost, world)
        return Plan(lengths, [wave], lockstep=True, shapes=batch.shapes, info={"degree": degree})
