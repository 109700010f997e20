"""A profile's points priced by the model fitted to them: errors per point and their summaries."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..pricing.cost import CostModel
from ..pricing.remapping import remap_overhead
from .grid import Measurement


def prediction_errors(measurements: Sequence[Measurement], cost_at: dict[int, CostModel]) -> list[dict]:
    """Every measurement next to the prediction of the CostModel of its depth."""
    rows = []
    for m in measurements:
        p, cost = m.point, cost_at[m.point.layers]
        predicted = cost.time(p.samples, p.degree, p.recompute, p.cp)
        if p.remap:  # every group as long as the others: the layer moves no row
            predicted += remap_overhead(cost, p.tokens / p.degree, p.recompute)
        saved = (cost.act_per_token * m.shard_tokens * (p.recompute * cost.kept + 1.0 - p.recompute)
                 + cost.gathered_per_token(p.degree, p.cp) * (1.0 - p.recompute) * p.tokens)
        rows.append(dict(point=p.label(), layers=p.layers, lengths=list(p.lengths),
                         **({} if p.shapes is None else dict(shapes=[list(c) for c in p.shapes])), degree=p.degree,
                         **(dict(remap=True) if p.remap else {}),
                         **({} if p.cp == 1 else dict(cp=p.cp, context_s=m.context_seconds,
                                                      context_priced_s=cost.comm(p.tokens, p.degree, p.cp)
                                                      - cost.comm(p.tokens / p.cp, p.ulysses))),
                         recompute_layers=p.recompute_layers, measured_s=m.seconds, predicted_s=predicted,
                         time_error=predicted / m.seconds - 1.0, comm_s=m.comm_seconds,
                         measured_act_bytes=m.activation_bytes, predicted_act_bytes=saved,
                         act_error=saved / m.activation_bytes - 1.0))
    return rows


def time_and_act_errors(rows: list[dict]) -> dict:
    """`error_summary` of the time and activation errors of `prediction_errors` rows."""
    return {key: error_summary([row[f"{key}_error"] for row in rows]) for key in ("time", "act")}


def error_summary(errors: Sequence[float]) -> dict:
    """Median, 90th percentile and largest absolute relative error."""
    e = np.abs(np.asarray(errors, dtype=float))
    if e.size == 0:
        return dict(median=None, p90=None, max=None, count=0)
    return dict(median=float(np.median(e)), p90=float(np.percentile(e, 90)), max=float(e.max()), count=int(e.size))
