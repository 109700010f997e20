"""Zeppelin's remapping layer as the planners, the simulator and the bound see it: its memory,
its slots' prices and loads, and its terms of the lower bound, side by side.

A remap domain of a wave (`Wave.remap`: the cluster, or an aligned block of 2+ ranks) runs its
groups' micro-batches slot by slot: slot m holds every group's m-th micro-batch, attention runs
in each group's own layout (`layouts.py`) and everything else on a token-balanced layout over
the domain, at the slot's lowest recompute level (a recomputed layer repeats collectives, so
all ranks of the domain recompute alike). The runtime's side is `runtime/remap.py`.

    memory          a rank keeps attention's saved q, k, v and output (`ATTENTION_SHARE`) for its
                    group's shard and the rest (and a recomputed layer's input) for its
                    balanced share (`memory`, `recompute`)
    slot_load       a slot's busiest attention rank, balanced share and level
    overflow        why a domain would not fit (what `Plan.validate` raises)
    levels          the least level each slot fits at (`Plan.leveled`, for planners)
    slot_tokens     where a slot's tokens sit before its move
    slot_time       the timeline's price of a slot, the remap layer's own overhead included
                    (`remap_overhead`)
    bound_terms     the least slot a sequence can run in, and what its slot's idle ranks
                    cost it, for the lower bound (`bounds.py`)

A slot is what plans/plan.py hands over, its micro-batches as `SlotPart`s (`Plan.slot_parts`):
this module prices and never reads a plan, so the plan contract can ask it.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

from .cost import CostModel
from .micro_batch import LEVEL_EPS, recomputed_exchanges
from .nics import crosses_nodes, exchange_surcharge, fastest_move_rate, move_time
from ..vocabulary.samples import Sample, tokens as sample_tokens

# Of a layer's 17 saved values per hidden (cost_sources.ACT_VALUES_PER_HIDDEN), those attention itself
# saves (q, k, v and its output: flash attention's backward needs them) live in the attention
# layout; a remap domain keeps the other 13 and a recomputed layer's input on its balanced one.
ATTENTION_SHARE = 4 / 17
MEMORY_SLACK = 1e-6  # relative: float rounding in memory() must not reject an exact fit


def memory(cost: CostModel, attention: float, balanced: float, recompute: float) -> float:
    """Bytes on a remap-domain rank holding `attention` tokens in its group's attention layout
    and `balanced` tokens in the domain's balanced layout:

        states + act_per_token [(1 - c)(4/17 att + 13/17 bal) + c k bal]

    With both layouts equal this is `CostModel.memory`."""
    values = (1.0 - recompute) * (ATTENTION_SHARE * attention + (1.0 - ATTENTION_SHARE) * balanced)
    return cost.states + cost.act_per_token * (values + recompute * cost.kept * balanced)


def min_recompute(cost: CostModel, attention: float, balanced: float) -> float | None:
    """The smallest recompute level (a multiple of 1/layers) at which a remap-domain rank
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


# --- slots -----------------------------------------------------------------------------------
class SlotPart(NamedTuple):
    """One group's micro-batch in a slot of a remap domain (`Plan.slot_parts` lists them)."""

    start: int
    """The group's first rank (where its tokens sit before the move)."""
    degree: int
    samples: list[Sample]
    recompute: float
    cp: int
    """The group's context-parallel part (`plans.Group.cp`)."""


def slot_load(cost: CostModel, parts: Sequence[SlotPart], size: int) -> tuple[float, int, float]:
    """(the most tokens a rank holds in the attention layout, the tokens every rank holds in the
    balanced layout, the slot's recompute level: its micro-batches' lowest) of a slot of a
    domain of `size` ranks; (0, 0, 0.0) for a slot nobody uses. A context-parallel group's
    gathered K and V (`CostModel.gathered_per_token`, kept where attention's values are) count
    as the attention tokens that would take as many bytes."""
    tokens = [sum(map(sample_tokens, p.samples)) for p in parts]
    per_value = cost.act_per_token * ATTENTION_SHARE
    return (max((-(-n // p.degree) + cost.gathered_per_token(p.degree, p.cp) * n / per_value
                 for p, n in zip(parts, tokens)), default=0),
            -(-sum(tokens) // size), min((p.recompute for p in parts), default=0.0))


def overflow(cost: CostModel, loads: Sequence[tuple[int, int, float]]) -> str | None:
    """Why a domain whose slots have these `slot_load`s would not fit device memory, or None:
    the busiest rank of every slot, at the slot's level (the runtime's), priced by `memory`."""
    for m, (attention, balanced, level) in enumerate(loads):
        used = memory(cost, attention, balanced, level)
        if used > cost.device_memory * (1 + MEMORY_SLACK):
            return (f"slot {m}: a rank holding {attention:.0f} tokens for attention and {balanced} balanced "
                    f"needs {used / 1e9:.2f} GB at recompute {level:.2f}; the device has "
                    f"{cost.device_memory / 1e9:.2f} GB")
    return None


def levels(cost: CostModel, loads: Sequence[tuple[int, int, float]]) -> list[float | None]:
    """The least recompute level every slot of these `slot_load`s fits at (None: none). A
    planner that remaps groups gives every slot that level (`Plan.leveled`): a long sequence
    may then recompute less than in its group alone, and the sequences beside it recompute as
    much as it must."""
    return [min_recompute(cost, attention, balanced) for attention, balanced, _ in loads]


def slot_tokens(parts: Sequence[SlotPart], start: int, size: int) -> np.ndarray:
    """Tokens each rank of the domain of `size` ranks from `start` holds for attention in a slot
    (its group's share; none on the ranks of idle groups), in rank order."""
    held = np.zeros(size)
    for p in parts:
        held[p.start - start:p.start - start + p.degree] = sum(map(sample_tokens, p.samples)) / p.degree
    return held


def slot_time(cost: CostModel, parts: Sequence[SlotPart], start: int, size: int,
              routed: bool = False) -> tuple[float, float]:
    """(compute, comm) of a slot of the remap domain of `size` ranks from rank `start`.

    The slot runs every group's micro-batch at their lowest recompute level (as the runtime
    does) and lasts the slowest group's attention (a q work and its all-to-alls) + the slot's
    linear device-seconds (b s) / size + its fixed seconds at that level (`fixed_seconds`) +
    moving q, k, v and the output of the largest per-rank surplus or deficit of tokens
    (`bytes_per_token`: their own heads, never replicated; forward and backward) over the
    domain's bandwidth + the layer's own overhead on
    the balanced share (`remap_overhead`, counted as communication). A domain over two or more nodes
    moves them over the NICs instead (`nics.move_time`, routed or not), and each group's
    exchanges pay their NICs' surcharge (`nics.exchange_surcharge`)."""
    if not parts:
        return cost.g, 0.0
    level = min(p.recompute for p in parts)
    attention = comm = linear = 0.0
    per_rank = []
    for p in parts:
        tokens = sum(map(sample_tokens, p.samples))
        all_to_all = (cost.comm(tokens, p.degree, p.cp, level)
                      + exchange_surcharge(cost, p.degree, p.cp, tokens, routed, level))
        units = float(cost.units(p.samples).sum())
        quadratic = cost.a * units * (1.0 + level * cost.recompute_attention) * cost.attention_factor(p.cp)
        whole = cost.call_time(p.samples, level) + cost.rank_sample_time(len(p.samples), level)
        attention = max(attention, quadratic / p.degree + whole + all_to_all)
        comm = max(comm, all_to_all)
        linear += cost.b * tokens * (1.0 + level * cost.recompute)
        per_rank += [tokens / p.degree] * p.degree
    if crosses_nodes(cost, size):
        transfer = move_time(cost, slot_tokens(parts, start, size), start, routed)
    else:
        mean = sum(per_rank) / size
        per_rank += [0.0] * (size - len(per_rank))  # ranks of idle groups take a share too
        transfer = max(abs(n - mean) for n in per_rank) * cost.bytes_per_token / bandwidth(cost, size)
    overhead = remap_overhead(cost, sum(per_rank) / size, level)
    total = attention + linear / size + cost.fixed_seconds(level) + transfer + overhead
    return total - comm - transfer - overhead, comm + transfer + overhead


def remap_overhead(cost: CostModel, tokens_per_rank: float, recompute: float) -> float:
    """What running a slot of `tokens_per_rank` balanced tokens per rank through the remap layer
    costs besides its moves (`CostModel.remap_per_token`, `remap_latency`); a recomputed block
    repeats its forward exchanges, as the all-to-alls' (`recomputed_exchanges`)."""
    return ((cost.remap_latency + cost.remap_per_token * tokens_per_rank)
            * recomputed_exchanges(recompute))


# --- the lower bound's terms -----------------------------------------------------------------
def bound_terms(cost: CostModel, s: np.ndarray, q: np.ndarray,
                others: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(alone, area, led), each [degree index, sequence]: the least time without g of a remap
    slot holding a sequence of s tokens and q attention units in a group of each degree, the
    least device-seconds that sequence takes of it, and the least it takes leading its slot (inf
    where no slot holds it; area and led inf also where a remap cannot take less than the
    sequence's group alone).

    In a domain of `size` ranks at the slot's level L the sequence's group runs its attention
    and all-to-alls (group = a q (1 + L r_attn) / d + comm), the domain at least its linear work
    (linear = b s (1 + L r), over size ranks), and the group's ranks hold at least s / d tokens
    for attention, and beside them the K and V every split of degree d gathers (`slot_load`).
    Memory (`memory`) then caps the balanced share a rank can hold beside them, `most`; a slot's
    share is at least s / size, and the timeline moves at least s / d - most tokens off each of
    the group's ranks (moved, `slot_time`: at the domain's bandwidth, or over two or more nodes at
    no more than `nics.fastest_move_rate`). The group's d ranks spend the attention and that
    move on this sequence alone, and its linear work is done somewhere: the area,
    d (group + moved) + linear. A sequence that fits its group without recomputation needs no
    move at L = 0, so its least slot spreads the linear work over the whole cluster and its area
    is its own (a remap saves it nothing).

    led: the area, or more where the slot must leave ranks idle. The slot lasts at least
    `group` + moved, on all size ranks of the domain, and holds at most size x most tokens
    (every rank's balanced share fits beside this group's attention). Every other sequence i of
    the slot is charged by the bound at most `others` s_i + b s_i (`others`: the most
    device-seconds per token beyond linear work any sequence of the batch takes in its group
    alone, `bounds.lower_bound`), so together the others are charged at most
    others (size most - s) + their linear work, and the slot's area leaves this sequence

        filled = size (group + moved) + linear - others (size most - s).

    Per slot: if some sequence of it is charged its `filled` (where that is above its area), the
    others are charged as above and the slot's area covers them all; otherwise every sequence of
    it is charged at most its area (its group's ranks' attention and moves, and linear work),
    which the slot's area covers as before. So led = the least over sizes and levels of
    max(area, filled) is a bound on what the sequence takes of any slot."""
    n = cost.world_size
    sizes = sorted({n, *(1 << i for i in range(1, n.bit_length()))} - {1})  # domains: 2+ ranks
    free = (cost.device_memory - cost.states) / cost.act_per_token
    levels = np.arange(cost.layers + 1)[:, None] / cost.layers
    alone = np.full((len(cost.degrees), len(s)), np.inf)
    area = np.full_like(alone, np.inf)
    led = np.full_like(alone, np.inf)
    attention = cost.attention_time(s, q)
    for i, d in enumerate(cost.degrees):
        comm = np.min([cost.exchange_seconds(s, d, cp) for cp in cost.catalogue.context_parts(d)], axis=0)
        alone[i] = attention / d + comm + cost.b * s / n
        tight = np.flatnonzero(s / d > free)
        if not len(tight):
            continue
        held = s[tight] / d
        # Every split's gathered K and V sit beside its attention values (`slot_load`).
        gathered = min(cost.gathered_per_token(d, cp) for cp in cost.catalogue.context_parts(d)) * s[tight] / cost.act_per_token
        most = ((free - (1.0 - levels) * (ATTENTION_SHARE * held + gathered))
                / ((1.0 - levels) * (1.0 - ATTENTION_SHARE) + levels * cost.kept))
        group = attention[tight] * (1.0 + levels * cost.recompute_attention) / d + comm[tight]
        linear = cost.b * s[tight] * (1.0 + levels * cost.recompute)
        slot, used, leading = (np.full(len(tight), np.inf) for _ in range(3))
        for size in sizes:
            if size < d:
                continue
            rate = fastest_move_rate(cost, size) if crosses_nodes(cost, size) else bandwidth(cost, size)
            moved = np.maximum(held - most, 0.0) * cost.bytes_per_token / rate
            fits = most >= s[tight] / size
            mine = d * (group + moved) + linear
            filled = (size * (group + moved) + linear - others * (size * most - s[tight])
                      if math.isfinite(others) else mine)
            slot = np.minimum(slot, np.where(fits, group + linear / size + moved, np.inf).min(axis=0))
            used = np.minimum(used, np.where(fits, mine, np.inf).min(axis=0))
            leading = np.minimum(leading, np.where(fits, np.maximum(mine, filled), np.inf).min(axis=0))
        alone[i, tight], area[i, tight], led[i, tight] = slot, used, leading
    return alone, area, led
