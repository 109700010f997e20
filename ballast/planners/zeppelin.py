"""`zeppelin`: Zeppelin's hierarchical partitioning and remapping layer on ballast's plan contract.

Zeppelin (Chen et al., arXiv:2509.21841) keeps short sequences on one device, splits medium ones
inside a node, lets only very long ones cross nodes, remaps tokens so linear modules see a
balanced layout, and routes inter-node traffic over all NICs. Per step, for T = theta x the
cost model's lower bound (theta in THETAS; every theta and layout is built, the best kept):

1. Classes from cost crossovers: a sequence takes, of the degrees where it fits and alone ends
   within T, the one of least device-seconds d time(s, d): it moves to 2d where that is cheaper
   per device-second (less recomputation) or where d is too slow beside the balanced per-rank
   load. Degree 1 is local, up to devices_per_node intra-node, more inter-node. time(s, d) is
   the sample's own (`sequence_times`: its tokens and attention units), so a video
   clip is classed by its shape; `crossovers()` reports the boundaries as text lengths.
2. Node level: inter-node sequences get aligned blocks of whole nodes, one group each running
   its sequences in turn (a block opens when the least-loaded one would pass T). The rest go to
   the other nodes by LPT on estimated node-seconds under a cap; the overflow runs in a later
   wave over all nodes. Layouts: "shared" caps at T, "fill" at the inter-node groups' length,
   "separate" also spreads inter-node sequences over every free block.
3. Rank level: intra-node sequences (widest first) open aligned blocks in their node or join the
   least-loaded one of their degree; free ranks are single-rank groups; local sequences go,
   longest first, where they finish earliest (a wider group always has the memory).
4. Micro-batches: each group packs token-balanced into the fastest k micro-batches, k between the
   fewest memory allows and the count needing no recomputation, each at `cost.min_recompute`.

Remapping (`options.remap`, on by default) is Zeppelin's remapping layer as the runtime runs
it (`Wave.remap`, `ballast.runtime.remap`): the groups of a domain (a node, or the whole wave)
run micro-batch slot by slot and spread each slot's tokens evenly over the domain for
everything but attention. Per wave, the domains of one scope are remapped where that fits
memory (each slot at the least recompute level it needs there, `Plan.leveled`) and
their groups finish sooner under `timeline.remap_slots` (slowest attention + linear
work / domain size + moving the largest per-rank surplus + g), and the scope is kept if the
wave is faster (not under pipeline parallelism, nor routing: a pipeline stage runs neither).
`info["remap"]` lists the domains and the step time with and without them;
with remap on, one more candidate is built in Zeppelin's split (ranks balanced by attention
alone, linear work left to the remap) and kept if faster.

Routing (`options.routing`, on by default) is Zeppelin's routing layer: every wave whose
all-to-alls cross nodes is routed over every NIC of the node (`Wave.routed`), as the paper's
layer always is, and priced so (`nics.py`). Its inter-node groups here span whole nodes and
load every NIC alike, where routing only adds the hand-offs to proxies; a remap over the whole
wave, whose surplus ranks may sit under a few NICs, is where it can gain.

Ours, not the paper's: the plan contract's aligned power-of-two Ulysses groups and waves (a
node hosting an inter-node sequence does nothing else in that wave), thresholds from ballast's
cost model, the candidate search over theta and layouts, and the choice of remap domain.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..pricing.cost import CostModel
from ..vocabulary.layouts import Splits, ulysses_in_node
from ..plans.plan import Group, MicroBatch, Plan, Wave, fill_idle
from ..vocabulary.samples import SampleBatch
from ..plans.timeline import step_time, wave_time
from .base import Planner
from .packing import longest_processing_time, mb_time, micro_batch, pad_lockstep
from ..pricing.bounds import lower_bound
from .registry import register
from ..pricing.sequence_times import sequence_times

THETAS = (1.25, 1.0, 0.6)
"""Targets as fractions of the lower bound: how long a sequence may run alone."""
LAYOUTS = ("shared", "fill", "separate")
MAX_PACKINGS = 12
"""Micro-batch counts tried per group (sampled evenly over a wider range)."""


@dataclass
class _Draft:
    """A group being filled: its block, sequences and estimated per-rank seconds."""
    start: int
    degree: int
    ids: list[int] = field(default_factory=list)
    load: float = 0.0


@dataclass
class _Step:
    """Per-step estimates shared by the candidate builds: per degree, per sequence, per-rank
    seconds (with a token-proportional memory overhead), in total and without the b s term."""
    batch: SampleBatch
    total: dict[int, list[float]]
    attention: dict[int, list[float]]
    cls: list[int] = field(default_factory=list)
    """Class degree per sequence."""
    by_attention: bool = False
    """Balance ranks inside a node by attention alone, leaving linear work to the remap."""

    def e(self, i: int, degree: int) -> float:
        return self.total[degree][i]

    def r(self, i: int, degree: int) -> float:
        """What the rank level balances."""
        return (self.attention if self.by_attention else self.total)[degree][i]


def classify(times: np.ndarray, degrees: Sequence[int], budget: float) -> np.ndarray:
    """Per sequence, the degree of least device-seconds among those where it alone takes at most
    `budget` (times: [degree index, sequence], inf where it does not fit); else the fastest."""
    area = np.where(times <= budget, times * np.asarray(degrees, dtype=np.float64)[:, None], np.inf)
    pick = np.argmin(area, axis=0)
    none = ~np.isfinite(area.min(axis=0))
    pick[none] = np.argmin(times[:, none], axis=0)
    return np.asarray(degrees)[pick]


def crossovers(cost: CostModel, budget: float, devices_per_node: int) -> dict[str, int]:
    """The longest text sequences (token counts on a ~1% grid) that stay local, and that stay
    inside a node: a report of the classes, not what sets them. `classify` reads each sample's
    own `sequence_times` (tokens and attention units), so a clip gets the class its time gives it;
    under `causal` or `full` attention a clip's units follow its tokens as a text sequence's do
    and these lengths bound its class too; under `spatial-temporal` they do not."""
    grid = np.unique(np.geomspace(1, cost.max_tokens(cost.degrees[-1], 1.0), 800).astype(np.int64))
    cls = classify(sequence_times(cost, grid.tolist()), cost.degrees, budget)
    local, intra = grid[cls == 1], grid[cls <= devices_per_node]
    return {"local_max_len": int(local.max()) if local.size else 0,
            "intra_max_len": int(intra.max()) if intra.size else 0}


def balance_nodes(weights: Sequence[float], nodes: int, cap: float = math.inf) -> tuple[list[list[int]], list[int]]:
    """LPT of item weights onto nodes; an item that would push a non-empty node past `cap` is
    deferred. With cap = inf: max load <= mean load + max weight (list scheduling)."""
    heap = [(0.0, j) for j in range(nodes)]
    out: list[list[int]] = [[] for _ in range(nodes)]
    deferred = []
    for i in sorted(range(len(weights)), key=lambda i: -weights[i]):
        load, j = heap[0]
        if load > 0 and load + weights[i] > cap:
            deferred.append(i)  # the least-loaded node cannot take it, so none can
            continue
        heapq.heapreplace(heap, (load + weights[i], j))
        out[j].append(i)
    return out, deferred


@register
class ZeppelinPlanner(Planner):
    name = "zeppelin"

    def splits(self) -> Splits:
        """Its hierarchical partitioning: Ulysses inside a node, context parallelism across."""
        return ulysses_in_node(self.cluster.devices_per_node)

    def _plan(self, batch: SampleBatch) -> Plan:
        cost, ppn = self.cost, self.cluster.devices_per_node
        s = np.asarray(batch.lengths, dtype=np.float64)
        deg = np.asarray(cost.degrees, dtype=np.float64)[:, None]
        # Each sample's own times (its tokens and attention units): the classes below follow them.
        times = sequence_times(cost, batch.samples)
        # Past what fits without recomputation a rank pays per token recomputation or another
        # micro-batch's g (the lower bound's memory term): charged per token, it makes the
        # balance token-aware as well as attention-aware.
        free_tokens = (cost.device_memory - cost.states) / cost.act_per_token
        est = times + min(cost.recompute * cost.b / (1.0 - cost.kept), cost.g / free_tokens) * s / deg
        step = _Step(batch, dict(zip(cost.degrees, est.tolist())),
                     dict(zip(cost.degrees, (est - cost.b * s / deg).tolist())))
        target = lower_bound(cost, batch.samples)
        best: tuple[float, Plan, float, np.ndarray] | None = None
        seen: set[bytes] = set()
        for theta in THETAS:
            budget = theta * target - cost.g
            if budget <= 0:  # no sequence could finish in time: every one would go to the widest degree
                continue
            cls = classify(times, cost.degrees, budget)
            if cls.tobytes() in seen:
                continue
            seen.add(cls.tobytes())
            step.cls = cls.tolist()
            for layout in LAYOUTS if max(step.cls) > ppn else LAYOUTS[:1]:
                plan = self._build(step, target, layout)
                plan.info.update(theta=theta, layout=layout, target_s=target, rank_balance="total")
                plan.info["remap"] = self._remap(plan)
                if best is None or plan.info["remap"]["predicted_step_s"] < best[0]:
                    best = (plan.info["remap"]["predicted_step_s"], plan, budget, cls)
        assert best is not None
        score, plan, budget, cls = best
        if self._remaps:  # Zeppelin's split, kept only if predicted faster
            step.cls, step.by_attention = cls.tolist(), True
            alt = self._build(step, target, plan.info["layout"])
            alt.info.update(plan.info, rank_balance="attention", remap=self._remap(alt))
            plan = alt if alt.info["remap"]["predicted_step_s"] < score else plan
        plan.info["crossovers"] = crossovers(cost, budget, ppn)
        plan.info["classes"] = {"local": int((cls == 1).sum()), "intra_node": int(((cls > 1) & (cls <= ppn)).sum()),
                                "inter_node": int((cls > ppn).sum())}
        return plan

    # --- node level ----------------------------------------------------------------------------
    def _build(self, step: _Step, target: float, layout: str) -> Plan:
        ppn, nodes = self.cluster.devices_per_node, self.cluster.nodes
        inter = [i for i in range(len(step.batch)) if step.cls[i] > ppn]
        rest = [i for i in range(len(step.batch)) if step.cls[i] <= ppn]
        waves: list[Wave] = []
        while inter:
            drafts, inter = self._place_inter(step, inter, 0.0 if layout == "separate" else target)
            used = {r // ppn for g in drafts for r in range(g.start, g.start + g.degree)}
            free = [j for j in range(nodes) if j not in used]
            if free and rest:
                cap = max(g.load for g in drafts) + self.cost.g
                placed, rest = self._spread(step, rest, free, max(cap, target) if layout == "shared" else cap)
                drafts += placed
            waves.append(self._wave(step, drafts))
        if rest:
            placed, left = self._spread(step, rest, list(range(nodes)), math.inf)
            assert not left
            waves.append(self._wave(step, placed))
        return Plan(step.batch.lengths, waves, lockstep=self.options.lockstep, shapes=step.batch.shapes)

    def _place_inter(self, step: _Step, ids: list[int], target: float) -> tuple[list[_Draft], list[int]]:
        """Inter-node sequences onto aligned blocks of whole nodes; those left for a later wave."""
        ppn, nodes = self.cluster.devices_per_node, self.cluster.nodes
        taken = [False] * nodes
        drafts: list[_Draft] = []
        deferred = []
        for i in sorted(ids, key=lambda i: (-step.cls[i], -step.e(i, step.cls[i]))):
            d = step.cls[i]
            k, e = d // ppn, step.e(i, d)
            group = min((g for g in drafts if g.degree == d), key=lambda g: g.load, default=None)
            if group is None or group.load + e > target:
                start = next((j for j in range(0, nodes - k + 1, k) if not any(taken[j:j + k])), None)
                if start is not None:
                    taken[start:start + k] = [True] * k
                    group = _Draft(start * ppn, d)
                    drafts.append(group)
            if group is None:
                deferred.append(i)
            else:
                group.ids.append(i)
                group.load += e
        return drafts, deferred

    def _spread(self, step: _Step, ids: list[int], nodes: list[int], cap: float) -> tuple[list[_Draft], list[int]]:
        """Local and intra-node sequences balanced over `nodes` (node-seconds), then over ranks."""
        ppn = self.cluster.devices_per_node
        weights = [step.e(i, step.cls[i]) * step.cls[i] / ppn for i in ids]
        per_node, deferred = balance_nodes(weights, len(nodes), cap)
        drafts = [g for j, idx in zip(nodes, per_node) for g in self._rank_level(step, j * ppn, [ids[k] for k in idx])]
        return drafts, [ids[k] for k in deferred]

    # --- rank level ----------------------------------------------------------------------------
    def _rank_level(self, step: _Step, base: int, ids: list[int]) -> list[_Draft]:
        ppn = self.cluster.devices_per_node
        target = sum(step.r(i, step.cls[i]) * step.cls[i] for i in ids) / ppn  # the node's mean
        owner: list[_Draft | None] = [None] * ppn
        drafts: list[_Draft] = []
        for i in sorted((i for i in ids if step.cls[i] > 1), key=lambda i: (-step.cls[i], -step.r(i, step.cls[i]))):
            d = step.cls[i]
            group = min((g for g in drafts if g.degree == d), key=lambda g: g.load, default=None)
            if group is None or group.load + step.r(i, d) > target:
                start = next((r for r in range(0, ppn, d) if all(o is None for o in owner[r:r + d])), None)
                if start is not None:
                    group = _Draft(base + start, d)
                    owner[start:start + d] = [group] * d
                    drafts.append(group)
            if group is None:  # wider blocks, opened first, cover the ranks a block of d needs
                group = min((g for g in drafts if g.degree >= d), key=lambda g: g.load + step.r(i, g.degree))
            group.ids.append(i)
            group.load += step.r(i, group.degree)
        drafts += [_Draft(base + r, 1) for r in range(ppn) if owner[r] is None]
        # Earliest finish: per degree only the least-loaded group can be best, so one heap each.
        heaps: dict[int, list[tuple[float, int]]] = {}
        for k, g in enumerate(drafts):
            heapq.heappush(heaps.setdefault(g.degree, []), (g.load, k))
        for i in sorted((i for i in ids if step.cls[i] == 1), key=lambda i: -step.r(i, 1)):
            d = min(heaps, key=lambda d: heaps[d][0][0] + step.r(i, d))
            group = drafts[heaps[d][0][1]]
            group.ids.append(i)
            group.load += step.r(i, d)
            heapq.heapreplace(heaps[d], (group.load, heaps[d][0][1]))
        return [g for g in drafts if g.ids]

    # --- micro-batches -------------------------------------------------------------------------
    def _wave(self, step: _Step, drafts: list[_Draft]) -> Wave:
        # Each group at the split it is priced at, so a remap domain's memory and time see its gathered K, V.
        groups = fill_idle([Group(g.start, g.degree, self._pack(step.batch, g.ids, g.degree), self.cost.catalogue.split(g.degree))
                            for g in drafts], self.cluster.world_size)
        wave = self._routed(Wave(groups))
        return pad_lockstep(wave, step.batch, self.cost) if self.options.lockstep else wave

    def _routed(self, wave: Wave) -> Wave:
        """`wave` routed over every NIC where its all-to-alls cross nodes: Zeppelin's routing layer
        is always on (unless `options.routing` is off, or under a pipeline: `Planner.pipelined`)."""
        wave.routed = self.options.routing and not self.pipelined and wave.crosses_nodes(self.cluster.devices_per_node)
        return wave

    def _pack(self, batch: SampleBatch, ids: list[int], degree: int) -> list[MicroBatch]:
        """The fastest token-balanced packing into k micro-batches, each at its least recompute level."""
        cost, lengths = self.cost, batch.lengths
        sizes = [lengths[i] for i in ids]
        hi = cost.max_tokens(degree, 1.0)
        k_min = max(1, math.ceil(sum(sizes) / hi))
        k_max = min(len(ids), max(k_min, math.ceil(sum(sizes) / max(1, cost.max_tokens(degree, 0.0)))))
        best: tuple[float, list[list[int]]] = (math.inf, [[j] for j in range(len(ids))])
        for k in range(k_min, k_max + 1, max(1, math.ceil((k_max - k_min) / MAX_PACKINGS))):
            bins = longest_processing_time(sizes, k) if k > 1 else [list(range(len(ids)))]
            sums = [sum(sizes[j] for j in b) for b in bins]
            if max(sums) > hi:
                continue  # LPT overshot the capacity; more micro-batches will fit
            total = sum(cost.time_from_sums(batch.units_of([ids[j] for j in b]), n, degree,
                                            cost.min_recompute(n, degree), samples=len(b)) for b, n in zip(bins, sums))
            best = min(best, (total, bins), key=lambda x: x[0])
        mbs = [micro_batch([ids[j] for j in b], lengths, degree, cost) for b in best[1]]
        # Longest first, so that slots of a remapped domain line up like sizes.
        return sorted(mbs, key=lambda mb: -mb_time(mb, batch, degree, cost)) if len(mbs) > 1 else mbs

    # --- remapping -----------------------------------------------------------------------------
    @property
    def _remaps(self) -> bool:
        """Whether plans get the remapping layer: asked for (`options.remap`), and no pipeline
        (`Planner.pipelined`)."""
        return self.options.remap and not self.pipelined

    def _remap(self, plan: Plan) -> dict:
        """Per wave, remap domains of one scope (every node, or the whole wave) where that is
        faster and fits memory, if the wave is then faster; sets `Wave.remap`, returns the info."""
        plain = step_time(plan, self.cost)
        if not self._remaps:
            return {"enabled": False, "domains": [], "predicted_step_s": plain, "step_s_without_remap": plain}
        for w, wave in enumerate(plan.waves):
            best = (wave_time(plan, wave, self.cost), wave.groups, [])
            for width in (self.cluster.devices_per_node, self.cluster.world_size):
                groups, domains = list(wave.groups), []
                for domain in self._domains(wave, width):
                    if (remapped := self._remapped(plan, w, domain)) is not None:
                        start, size = domain
                        groups = [g for g in groups if not start <= g.start < start + size] + remapped
                        domains.append(domain)
                if domains:
                    candidate = self._routed(Wave(sorted(groups, key=lambda g: g.start), domains))
                    if (t := wave_time(plan, candidate, self.cost)) < best[0]:
                        best = (t, candidate.groups, domains)
            wave.groups, wave.remap = best[1], best[2]
            self._routed(wave)
        return {"enabled": True, "domains": [[w, *d] for w, wave in enumerate(plan.waves) for d in wave.remap],
                "predicted_step_s": step_time(plan, self.cost), "step_s_without_remap": plain}

    @staticmethod
    def _domains(wave: Wave, width: int) -> list[tuple[int, int]]:
        """Blocks of `width` ranks (an inter-node group's nodes as one) holding 2+ groups."""
        blocks: dict[tuple[int, int], int] = {}
        for g in wave.groups:
            size = max(width, g.degree)
            key = (g.start // size * size, size)
            blocks[key] = blocks.get(key, 0) + 1
        return sorted(d for d, groups in blocks.items() if groups > 1 and d[1] > 1)

    def _remapped(self, plan: Plan, w: int, domain: tuple[int, int]) -> list[Group] | None:
        """The domain's groups at the recompute levels its slots need remapped (`Plan.leveled`), if
        that fits memory and they finish sooner than unremapped; else None."""
        groups = plan.leveled(w, domain, self.cost)
        if groups is None:
            return None
        alone = Plan(plan.lengths, [self._routed(Wave(plan.waves[w].domain_groups(*domain)))],
                     lockstep=plan.lockstep, shapes=plan.shapes)
        remapped = Plan(plan.lengths, [self._routed(Wave(groups, [domain]))], lockstep=plan.lockstep,
                        shapes=plan.shapes)
        return groups if step_time(remapped, self.cost) < step_time(alone, self.cost) else None
