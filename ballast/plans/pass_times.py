"""The seconds of a plan's passes under a cost model: a micro-batch's work, FSDP2's gathers
around it, a wave's groups (remap slots included), the backward that ends a rank's waves, and
the bytes the step's exchanges load each NIC with (`timeline.py` composes them into the step)."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..pricing.cost import CostModel
from ..pricing.nics import crosses_nodes, exchange_surcharge, group_nic_bytes, move_load
from ..pricing.pipeline import FORWARD_SHARE, stage_passes
from ..pricing.remapping import slot_time, slot_tokens
from ..pricing.whole_step import DataParallelPrices
from .plan import Group, MicroBatch, Plan, Wave


def wave_time(plan: Plan, wave: Wave, cost: CostModel) -> float:
    """A wave's seconds: its slowest group's (under lockstep, slot by slot the slowest's)."""
    durations = [[sum(d) for d in group] for group in wave_passes(plan, wave, cost)]
    if plan.lockstep:
        depth = max((len(d) for d in durations), default=0)
        return sum(max(d[m] for d in durations if m < len(d)) for m in range(depth))
    return max((sum(d) for d in durations), default=0.0)


def wave_passes(plan: Plan, wave: Wave, cost: CostModel) -> list[list[tuple[float, float]]]:
    """[g][m] = (compute, comm) of group g's micro-batch m (in a remap domain: of slot m)."""
    durations = [[mb_time(plan, mb, g, cost, wave.routed) for mb in g.micro_batches] for g in wave.groups]
    for start, size in wave.remap:
        slots = [with_gathers(cost.data_parallel, *slot_time(cost, parts, start, size, wave.routed))
                 for parts in plan.slot_parts(wave, start, size)]
        for i in (i for i, g in enumerate(wave.groups) if start <= g.start < start + size):
            durations[i] = slots
    return durations


def mb_time(plan: Plan, mb: MicroBatch, group: Group, cost: CostModel, routed: bool) -> tuple[float, float]:
    """(compute, comm) of a micro-batch's pass: its work, and FSDP2's gathers where they outlast it."""
    compute, comm = work_time(plan, mb, group, cost, routed)
    if not cost.data_parallel.forward_gathers or not mb.recompute:
        return with_gathers(cost.data_parallel, compute, comm)
    plain = sum(work_time(plan, dataclasses.replace(mb, recompute=0.0), group, cost, routed))
    return with_gathers(cost.data_parallel, compute, comm, plain)


def with_gathers(prices: DataParallelPrices, compute: float, comm: float, plain: float | None = None
                  ) -> tuple[float, float]:
    """(compute, comm) of a pass with FSDP2's gathers around it (`gathered_seconds`): what they
    add is communication. `plain`: its seconds without recomputation (None: as they are)."""
    if not prices.forward_gathers:  # as it is, to the last bit
        return compute, comm
    seconds = compute + comm
    return compute, comm + gathered_seconds(prices, seconds, seconds if plain is None else plain) - seconds


def gathered_seconds(prices: DataParallelPrices, seconds: float, plain: float) -> float:
    """A micro-batch of `seconds` (`plain` without recomputation) with FSDP2's gathers around its
    forward and backward (`DataParallelPrices.passes`); `seconds` where nothing gathers."""
    if not prices.forward_gathers:
        return seconds
    return sum(prices.passes(*stage_passes(seconds, plain, 1)))


def work_time(plan: Plan, mb: MicroBatch, group: Group, cost: CostModel, routed: bool) -> tuple[float, float]:
    """(compute, comm) of a micro-batch's own work: the cost model's seconds and NIC surcharge."""
    if not mb.seq_ids:
        # A lockstep filler: no tokens, but the forward still joins the parameter gathers.
        return cost.g, 0.0
    compute, comm = cost.split_time(plan.mb_samples(mb), group.degree, mb.recompute, group.cp)
    if crosses_nodes(cost, group.degree):
        comm += exchange_surcharge(cost, group.degree, group.cp, sum(plan.mb_lengths(mb)), routed, mb.recompute)
    return compute, comm


def backward_seconds(plan: Plan, wave: Wave, g: int, cost: CostModel, seconds: float) -> float:
    """Seconds of the backward of group g's last micro-batch in `wave`, which lasts `seconds`:
    all but its forward (`FORWARD_SHARE` of its plain seconds; a remap slot's counted plain)."""
    group = wave.groups[g]
    if any(start <= group.start < start + size for start, size in wave.remap) or not group.micro_batches[-1].recompute:
        return seconds - FORWARD_SHARE * seconds
    mb = dataclasses.replace(group.micro_batches[-1], recompute=0.0)
    return seconds - FORWARD_SHARE * sum(work_time(plan, mb, group, cost, wave.routed))


def nic_bytes(plan: Plan, cost: CostModel) -> np.ndarray:
    """Bytes each NIC of `cost.network` sends in the plan's step (global NIC order,
    `Cluster.nic_of`): the exchanges of every group wider than a node and the token moves of
    every remap domain wider than a node, routed where their wave is. Empty without NICs to load."""
    network = cost.network
    if network is None or network.nodes == 1:
        return np.zeros(0)
    sent = np.zeros(network.nics)
    for wave in plan.waves:
        for group in wave.groups:
            if crosses_nodes(cost, group.degree):
                for mb in group.micro_batches:
                    sent += group_nic_bytes(cost, group.start, group.degree, group.cp, sum(plan.mb_lengths(mb)),
                                            wave.routed)
        for start, size in wave.remap:
            if crosses_nodes(cost, size):
                for parts in plan.slot_parts(wave, start, size):
                    sent += move_load(cost, slot_tokens(parts, start, size), start, wave.routed).sent
    return sent
