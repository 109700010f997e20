"""What no plan of a pipeline can beat (docs/design.md, section 5, *Pipelines*).

A pool rank r on the last stage runs its passes one after another, W_r seconds of them; its
first pass waits for its first micro-batch i's forwards through the p - 1 stages before it, and
after its last pass (a backward: on the last stage each forward is followed by its own
backward) its micro-batch j's backward still crosses the p - 1 stages before it:

    step >= (p - 1)(f_i + t_i) + W_r + (p - 1)(b_j + t_j)

Every micro-batch holds a sample, so its forward and backward on a stage take at least the
shortest sample's alone at its fastest degree and split, without recomputation, over p
(`stage_passes`: f + b = seconds / p, the forward a share of the plain seconds), and its rows
cross a boundary in at least that sample's at the widest degree (`transfer_seconds`). W_r is
a stage's share, 1 / p, of the seconds rank r's micro-batches take in the cost model, and the
busiest rank's are at least the lower bound of a plan without pipeline (`bounds.lower_bound`),
priced with the memory a stage offers (below). So

    LB_pp = max( LB(relaxed) / p + (p - 1) (min_d time(s_min, d) / p + 2 t(s_min)),
                 max_s (min_d alone(s, d) + g + 2 (p - 1) t(s)) )

The second term is a micro-batch's own chain: its forward runs through the p stages one after
another and its backward back, every stage its 1 / p of the seconds, its rows crossing the
p - 1 boundaries both ways; so no step is shorter than the chain of the micro-batch holding any
one sample, at least that sample alone at its best degree, split and least level
(`sequence_times`, plus g) and its rows over the widest group.

Memory: a micro-batch keeps on the last stage its layers' share and its whole loss, at least
1 / p of its activations in the cost model, so it fits only where those are within p times what
the last stage leaves free. The relaxed model gives every micro-batch that much room (states
the last stage's, free memory p times its own): every plan that passes `Plan.validate`'s stage
check fits it, so its bound holds for them all.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from ..vocabulary.layouts import ANY_SPLIT
from ..vocabulary.samples import Sample, tokens as sample_tokens
from .bounds import lower_bound, uncapped_lower_bound
from .cost import CostModel
from .pipeline import transfer_seconds
from .sequence_times import sequence_times


def relaxed_memory(cost: CostModel) -> CostModel:
    """`cost` with the room a micro-batch has on the last stage of its pipeline: that stage's
    states, and p times the memory it leaves free (module docstring)."""
    stages = cost.stages
    states = stages.states[-1]
    return dataclasses.replace(cost, states=states,
                               device_memory=states + stages.count * (cost.device_memory - states))


def unavoidable_bubble(cost: CostModel, samples: Sequence[Sample]) -> float:
    """(p - 1) times the least forward, backward and two boundary crossings a micro-batch can
    take on a stage: the shortest sample alone at its fastest degree and split without
    recomputation, its rows over the widest group (module docstring)."""
    stages, every = cost.stages, cost.under(ANY_SPLIT)
    shortest = min(samples, key=sample_tokens)
    alone = min(every.time([shortest], d, 0.0, cp) for d in every.degrees for cp in every.catalogue.context_parts(d))
    moved = transfer_seconds(sample_tokens(shortest), every.degrees[-1], stages.hidden, stages.bandwidth,
                             stages.latency)
    return (stages.count - 1) * (alone / stages.count + 2 * moved)


def pipeline_lower_bound(cost: CostModel, samples: Sequence[Sample]) -> float:
    """No plan of the cost model's pipeline (`cost.stages`, p > 1) takes a step shorter than
    this: the busiest rank's share of a stage's work, at least `lower_bound` / p under the
    stage's memory, plus the bubble no 1F1B order of micro-batches avoids, or the longest chain
    of one micro-batch through the stages (module docstring)."""
    assert cost.stages is not None, "a pipeline's bound needs its stages' prices"
    if not len(samples):
        return 0.0
    relaxed = relaxed_memory(cost).under(ANY_SPLIT)
    work = lower_bound(relaxed, samples) / cost.stages.count
    return max(work + unavoidable_bubble(cost, samples), longest_chain(relaxed, samples))


def longest_chain(cost: CostModel, samples: Sequence[Sample]) -> float:
    """The longest chain of a micro-batch through the pipeline, forward and back, that the
    samples force: the slowest sample alone at its best degree and split (least level, plus g)
    and its rows across the p - 1 boundaries both ways over the widest group."""
    stages, every = cost.stages, cost.under(ANY_SPLIT)
    alone = np.min(sequence_times(every, samples, every_split=True), axis=0) + cost.g
    moved = np.asarray([transfer_seconds(sample_tokens(x), every.degrees[-1], stages.hidden, stages.bandwidth,
                                         stages.latency) for x in samples])
    return float(np.max(alone + 2 * (stages.count - 1) * moved))


def report_lower_bound(cost: CostModel, samples: Sequence[Sample]) -> float:
    """What reports divide a whole step by: the least step of the waves, the pipeline's bound
    under PP, else the bound of every split (`uncapped_lower_bound`), with the least of what
    follows them (`whole_step.py`'s bound: the last bucket's reduction, or every bucket's, and
    the optimizer step; under PP the stage that ends last is not known, so the least over them)."""
    if cost.stages is None:
        return cost.data_parallel.least_end(uncapped_lower_bound(cost, samples))
    waves = pipeline_lower_bound(cost, samples)
    prices = cost.stages.data_parallel
    if not prices:
        return waves
    return max(waves + min(p.last_bucket + p.after_reduction for p in prices),
               max(p.reduction + p.after_reduction for p in prices))
