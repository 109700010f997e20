"""`batch-adaptive`: FlexSP's BatchAda baseline, the best single SP degree chosen per step.

For every degree that holds the batch's longest sequence it builds `static`'s plan (with the
least recompute level that fits that sequence) and keeps the fastest under the cost model.
"""
from __future__ import annotations

from ..plans.plan import Plan
from ..vocabulary.samples import SampleBatch
from ..plans.timeline import step_time
from .base import Planner
from .registry import register
from .static import fixed_layout_plan


@register
class BatchAdaptivePlanner(Planner):
    name = "batch-adaptive"

    def _plan(self, batch: SampleBatch) -> Plan:
        longest = max(batch.lengths)
        candidates = []
        for degree in self.cost.degrees:
            recompute = self.cost.min_recompute(longest, degree)
            if recompute is not None:
                candidates.append(fixed_layout_plan(batch, degree, recompute, self))
        return min(candidates, key=lambda p: step_time(p, self.cost))
