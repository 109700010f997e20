"""One slot of a remap domain as a rank of the domain runs it (`Executor`, `Wave.remap`): every
group's slot-th micro-batch, as one stream whose linear work is balanced over the domain's ranks
and whose attention runs on the plan's groups (`remap.py`'s two layouts)."""
from __future__ import annotations

import itertools

import torch

from ..models.protocol import Local, PackedStream, take
from ..plans.plan import Group, MicroBatch, Plan
from .attention import StreamShard
from .groups import ProcessGroups
from .hybrid import attention_rows
from .remap import RemappedStream, Route, overlaps
from .routing import RoutingGroups
from .shard_sizes import shard_sizes


def slot_parts(plan: Plan, wave: int, domain: tuple[int, int], slot: int) -> list[tuple[Group, MicroBatch]]:
    """Every group of the remap domain with its slot-th micro-batch (empty past its last)."""
    return [(g, g.micro_batches[slot] if slot < len(g.micro_batches) else MicroBatch([]))
            for g in plan.waves[wave].domain_groups(*domain)]


def slot_runs(plan: Plan, wave: int, domain: tuple[int, int], slot: int) -> bool:
    """Whether the slot holds any token (else the domain's ranks skip it alike)."""
    return any(sum(plan.mb_lengths(mb)) for _, mb in slot_parts(plan, wave, domain, slot))


def remapped_stream(plan: Plan, parts: list[tuple[Group, MicroBatch]], domain: tuple[int, int], rank: int,
                    shard: StreamShard | None, groups: ProcessGroups, device: torch.device,
                    routing: RoutingGroups | None) -> tuple[RemappedStream, Local]:
    """The slot's stream on `rank` and the rows it holds on the balanced layout: `parts` are the
    slot's (`slot_parts`), `shard` the rank's share of its own group's micro-batch in the
    attention layout (None where that is empty), `routing` the routing groups of a routed wave."""
    start, size = domain
    rows = [attention_rows(plan.mb_samples(mb), g.degree, g.cp) for g, mb in parts]
    attention = [len(r) for held in rows for r in held]
    balanced = shard_sizes(sum(attention), size)
    index = rank - start
    send, recv = overlaps(balanced, attention, index)
    whole = PackedStream.of([plan.samples[i] for _, mb in parts for i in mb.seq_ids], device)
    local: Local = slice(sum(balanced[:index]), sum(balanced[:index + 1]))
    if any(g.cp > 1 for g, _ in parts):
        # The domain order: every rank's attention rows in rank order, each group's stream
        # offset to its place in the slot's; both layouts cut it contiguously.
        offsets = itertools.accumulate((sum(plan.mb_lengths(mb)) for _, mb in parts), initial=0)
        order = torch.cat([r + o for held, o in zip(rows, offsets) for r in held]).to(device)
        local = order[local]
    # Routed over every NIC when the wave is and the domain spans nodes: every rank of the
    # domain knows every rank's rows (`overlaps`), so the matrix needs no gathering.
    spans = routing.spanning(size) if routing is not None else None
    route = (Route(groups.get(start, size), send, recv) if spans is None else
             spans.exchange([overlaps(balanced, attention, j)[0] for j in range(size)]))
    return RemappedStream(whole.bounds, take(whole.positions, local), whole.grids, shard=shard, route=route), local
