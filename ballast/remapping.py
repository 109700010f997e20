"""Zeppelin's remapping layer as the planners, the simulator and the bound see it: its memory,
its slots' prices and loads, and its terms of the lower bound, side by side.

A remap domain of a wave (`Wave.remap`: the cluster, or an aligned block of 2+ ranks) runs its
groups' micro-batches slot by slot: slot m holds every group's m-th micro-batch, attention runs
in each group's own layout (`layouts.py`) and everything else on a token-balanced layout over
the domain, at the slot's lowest checkpoint level (a recomputed layer repeats collectives, so
all ranks of the domain recompute alike). The runtime's side is `runtime/remap.py`.

    memory          a rank keeps attention's saved q, k, v and output (`ATTENTION_SHARE`) for its
                    group's shard and the rest (and a checkpointed layer's input) for its
                    balanced share (`memory`, `checkpoint`)
    slot_loads      per slot: the busiest rank's attention tokens, the balanced share, the level
    overflow        why a domain would not fit (what `Plan.validate` raises)
    leveled         a planner's copy of a domain's groups at the least level each slot fits
    slot_times      the timeline's price of every slot
    bound_terms     the least slot a sequence can run in, for the lower bound (`bounds.py`)

Every function takes the CostModel it prices with; plans are read, never imported (plans.py
imports this module).
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np

from .cost import CostModel, LEVEL_EPS

if TYPE_CHECKING:
    from .plans import Group, Plan

# Of a layer's 17 saved values per hidden (cost.ACT_VALUES_PER_HIDDEN), those attention itself
# saves (q, k, v and its output: flash attention's backward needs them) live in the attention
# layout; a remap domain keeps the other 13 and a checkpointed layer's input on its balanced one.
ATTENTION_SHARE = 4 / 17
MEMORY_SLACK = 1e-6  # relative: float rounding in memory() must not reject an exact fit


def memory(cost: CostModel, attention: float, balanced: float, checkpoint: float) -> float:
    """Bytes on a remap-domain rank holding `attention` tokens in its group's attention layout
    and `balanced` tokens in the domain's balanced layout:

        states + act_per_token [(1 - c)(4/17 att + 13/17 bal) + c k bal]

    With both layouts equal this is `CostModel.memory`."""
    values = (1.0 - checkpoint) * (ATTENTION_SHARE * attention + (1.0 - ATTENTION_SHARE) * balanced)
    return cost.states + cost.act_per_token * (values + checkpoint * cost.kept * balanced)


def checkpoint(cost: CostModel, attention: float, balanced: float) -> float | None:
    """The smallest checkpoint level (a multiple of 1/layers) at which a remap-domain rank
    holding `attention` and `balanced` tokens fits (`memory`), or None."""
    free = (cost.device_memory - cost.states) / cost.act_per_token
    full = ATTENTION_SHARE * attention + (1.0 - ATTENTION_SHARE) * balanced
    if full <= free * (1 + LEVEL_EPS):
        return 0.0
    saved = full - cost.kept * balanced
    if saved <= 0.0:
        return None
    level = math.ceil((full - free) / saved * cost.layers - LEVEL_EPS) / cost.layers
    return level if level <= 1.0 else None


def bandwidth(cost: CostModel, size: int) -> float:
    """All-to-all bytes/s over a remap domain of `size` ranks: the widest profiled degree within it."""
    return cost.bandwidth[max((k for k in cost.bandwidth if k <= size), default=min(cost.bandwidth))]


# --- a plan's domains ----------------------------------------------------------------------------
def slot_loads(plan: Plan, wave: int, start: int, size: int) -> list[tuple[int, int, float]]:
    """Per slot of the remap domain (start, size) of a wave: (the most tokens a rank holds in
    the attention layout, the tokens every rank holds in the balanced layout, the slot's
    checkpoint level: its micro-batches' lowest); (0, 0, 0.0) for a slot nobody uses."""
    groups = plan.waves[wave].domain_groups(start, size)
    loads = []
    for m in range(max((len(g.micro_batches) for g in groups), default=0)):
        busy = [(g.degree, g.micro_batches[m]) for g in groups
                if m < len(g.micro_batches) and g.micro_batches[m].seq_ids]
        tokens = [sum(plan.mb_lengths(mb)) for _, mb in busy]
        loads.append((max((-(-n // d) for (d, _), n in zip(busy, tokens)), default=0),
                      -(-sum(tokens) // size), min((mb.checkpoint for _, mb in busy), default=0.0)))
    return loads


def overflow(plan: Plan, wave: int, start: int, size: int, cost: CostModel) -> str | None:
    """Why the remap domain (start, size) of a wave would not fit device memory, or None: the
    busiest rank of every slot, at the slot's level (the runtime's), priced by `memory`."""
    for m, (attention, balanced, level) in enumerate(slot_loads(plan, wave, start, size)):
        used = memory(cost, attention, balanced, level)
        if used > cost.device_memory * (1 + MEMORY_SLACK):
            return (f"slot {m}: a rank holding {attention} tokens for attention and {balanced} balanced "
                    f"needs {used / 1e9:.2f} GB at checkpoint {level:.2f}; the device has "
                    f"{cost.device_memory / 1e9:.2f} GB")
    return None


def leveled(plan: Plan, wave: int, domain: tuple[int, int], cost: CostModel) -> list[Group] | None:
    """Copies of the domain's groups with every slot's micro-batches at the least checkpoint
    level that slot fits at; None if some slot fits at none. A planner that remaps groups gives
    every slot that level: a long sequence may then recompute less than in its group alone, and
    the sequences beside it recompute as much as it must."""
    levels = [checkpoint(cost, attention, balanced) for attention, balanced, _ in slot_loads(plan, wave, *domain)]
    if any(level is None for level in levels):
        return None
    return [dataclasses.replace(g, micro_batches=[dataclasses.replace(mb, checkpoint=level if mb.seq_ids else 0.0)
                                                  for mb, level in zip(g.micro_batches, levels)])
            for g in plan.waves[wave].domain_groups(*domain)]


def slot_times(plan: Plan, groups: list[Group], size: int, cost: CostModel) -> list[tuple[float, float]]:
    """(compute, comm) of every slot of a remap domain of `size` ranks holding `groups`.

    Slot m runs every group's m-th micro-batch at their lowest checkpoint level (as the runtime
    does) and lasts the slowest group's attention (a q work and its all-to-alls) + the slot's
    linear device-seconds (b s) / size + g + moving q, k, v and the output of the largest
    per-rank surplus or deficit of tokens (`bytes_per_token`: their own heads, never
    replicated; forward and backward) over the domain's bandwidth."""
    link = bandwidth(cost, size)
    slots = []
    for m in range(max((len(g.micro_batches) for g in groups), default=0)):
        busy = [(g, g.micro_batches[m]) for g in groups if m < len(g.micro_batches) and g.micro_batches[m].seq_ids]
        if not busy:
            slots.append((cost.g, 0.0))
            continue
        level = min(mb.checkpoint for _, mb in busy)
        attention = comm = linear = 0.0
        per_rank = []
        for g, mb in busy:
            lengths = plan.mb_lengths(mb)
            all_to_all = cost.comm(sum(lengths), g.degree)
            units = float(cost.units(plan.mb_samples(mb)).sum())
            quadratic = cost.a * units * (1.0 + level * cost.recompute_attention)
            attention = max(attention, quadratic / g.degree + all_to_all)
            comm = max(comm, all_to_all)
            linear += cost.b * sum(lengths) * (1.0 + level * cost.recompute)
            per_rank += [sum(lengths) / g.degree] * g.degree
        mean = sum(per_rank) / size
        per_rank += [0.0] * (size - len(per_rank))  # ranks of idle groups take a share too
        transfer = max(abs(n - mean) for n in per_rank) * cost.bytes_per_token / link
        total = attention + linear / size + cost.g + transfer
        slots.append((total - comm - transfer, comm + transfer))
    return slots


# --- the lower bound's terms -----------------------------------------------------------------
def bound_terms(cost: CostModel, s: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(alone, area), each [degree index, sequence]: the least time without g of a remap slot
    holding a sequence of s tokens and q attention units in a group of each degree, and the
    least device-seconds that sequence takes of it (inf where no slot holds it; area inf also
    where a remap cannot take less than the sequence's group alone).

    In a domain of `size` ranks at the slot's level L the sequence's group runs its attention
    and all-to-alls (a q (1 + L r_attn) / d + comm), the domain at least its linear work
    (b s (1 + L r) / size), and the group's ranks hold at least s / d tokens for attention.
    Memory (`memory`) then caps the balanced share a rank can hold beside them, `most`; a
    slot's share is at least s / size, and the timeline moves at least s / d - most tokens off
    each of the group's ranks (`slot_times`). The group's d ranks spend the attention and that
    move on this sequence alone, and its linear work is done somewhere: the area. A sequence
    that fits its group without checkpointing needs no move at L = 0, so its least slot spreads
    the linear work over the whole cluster and its area is its own."""
    n = cost.world_size
    sizes = sorted({n, *(1 << i for i in range(1, n.bit_length()))} - {1})  # domains: 2+ ranks
    free = (cost.device_memory - cost.states) / cost.act_per_token
    levels = np.arange(cost.layers + 1)[:, None] / cost.layers
    alone = np.full((len(cost.degrees), len(s)), np.inf)
    area = np.full_like(alone, np.inf)
    attention = cost.attention_time(s, q)
    for i, d in enumerate(cost.degrees):
        # Summed in the order the bound always had, so that unremapped results stay bit-identical.
        comm = cost.exchange_bytes(d) * s / cost.bandwidth[d] / d if d > 1 else np.zeros_like(s)
        alone[i] = attention / d + comm + cost.b * s / n
        tight = np.flatnonzero(s / d > free)
        if not len(tight):
            continue
        held = s[tight] / d
        most = ((free - (1.0 - levels) * ATTENTION_SHARE * held)
                / ((1.0 - levels) * (1.0 - ATTENTION_SHARE) + levels * cost.kept))
        group = attention[tight] * (1.0 + levels * cost.recompute_attention) / d + comm[tight]
        linear = cost.b * s[tight] * (1.0 + levels * cost.recompute)
        slot, used = np.full(len(tight), np.inf), np.full(len(tight), np.inf)
        for size in sizes:
            if size < d:
                continue
            moved = np.maximum(held - most, 0.0) * cost.bytes_per_token / bandwidth(cost, size)
            fits = most >= s[tight] / size
            slot = np.minimum(slot, np.where(fits, group + linear / size + moved, np.inf).min(axis=0))
            used = np.minimum(used, np.where(fits, d * (group + moved) + linear, np.inf).min(axis=0))
        alone[i, tight], area[i, tight] = slot, used
    return alone, area
