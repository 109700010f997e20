"""`dcp`: Data-Centric Parallel (Zhao et al., VideoSys): DCP-inter and DCP-intra.

DCP profiles once, per length bucket, the (SP degree, batch size) with the most samples per
device-second that fits memory (VideoSys' profiler ranks its runs by bs / sp / time), and at
run time fills the cluster with SP groups of those degrees. Here the cost model is the
profile. One step:

1. Buckets: token counts fall into geometric buckets (BUCKETS_PER_OCTAVE per doubling); a
   bucket is profiled at its upper length L, clamped to `max_len`, as DCP profiles its bucket
   sizes, and at the attention units of an L-token sample as dense as its densest member
   (`bucket_units`): L^2 for text under causal attention.
2. Profile: for every degree, the batch size is as many bucket-length sequences as fit
   memory, shrunk so that a micro-batch takes at most a target time; the degree with the most
   samples per device-second wins, and a bucket whose single sequence exceeds the target at
   every degree takes its fastest degree. The time cap is VideoSys' runtime balancing (its
   sampler shrinks the batch size of a bucket slower than the median, or doubles the SP size
   of a batch-size-1 bucket). Targets are multiples of the step's lower bound (TARGETS); the
   plan with the shortest predicted step is kept.
3. Micro-batches: a bucket's sequences, longest first, cut into ceil(n / bs) equal chunks.
4. Groups: micro-batches are pooled by degree; a wave admits degree classes largest first
   while they fit, then hands out more groups of those degrees, as aligned power-of-two blocks
   (`fill_idle` covers the rest).
   - DCP-inter: the free ranks go where they bring the slowest class's estimated group time
     down most, and a class's micro-batches are dealt longest-processing-time first, so each
     group's gradient-accumulation count (its micro-batch count) is whatever balances group
     times (VideoSys picks each group's count to bring its time nearest a common target).
   - without it (DCP with one accumulation count for everyone): the free ranks even out the
     micro-batches per group, dealt round-robin, so every group runs the same count
     whatever its micro-batches cost.
   Counts are bounded as DCP bounds accumulation steps, by a largest count
   (`max_grad_accumulation_steps`: MAX_ACCUMULATION) and by MAX_COUNT_RATIO between the
   largest and smallest count of a wave's busy groups; the overflow waits for another wave.
   Memory never forces a wider ratio: a group's count does not change its memory.
5. Recomputation. Without DCP-intra the run has one level, the least at which `max_len` fits
   the largest degree, and the profile sizes batches at it. DCP-intra is VideoSys' pyramid
   activation recomputation: its profiler lets a batch grow while it fits with every layer
   recomputed, spends the memory the batch leaves free on not recomputing layers, and scores
   the batch at the time that saves. So here the profile tries every level (a batch of a
   bucket at the least level it needs), and every micro-batch then runs at the least level
   its own tokens need: short buckets, whose batches leave memory free, run without
   recomputation, longer ones recompute more.

Modes (`PlannerOptions.dcp_mode`): `inter` = balanced counts, run level; `intra` = equal
counts, level per micro-batch; `both` (default) = balanced counts, level per micro-batch.

Deviations from the paper: DCP streams a dataset and leaves unconsumed samples to the next
iteration; a ballast step must place its whole batch, so a target time replaces VideoSys'
median and overflow becomes another wave. A group may run micro-batches of several buckets
of its degree (VideoSys gives a group one bucket per iteration). Mode names follow ballast's
docs/design.md; VideoSys calls dynamic SP alone "DCP-intra", the accumulation balancing
"DCP-inter", and pyramid recomputation an add-on to the latter.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..pricing.micro_batch import recomputed_exchanges
from ..plans.plan import Group, MicroBatch, Plan, Wave, fill_idle
from ..vocabulary.samples import SampleBatch
from ..plans.timeline import step_time
from .base import Planner
from .packing import fixed_recompute, pad_lockstep
from ..pricing.bounds import lower_bound
from .registry import register

BUCKETS_PER_OCTAVE = 2
MAX_ACCUMULATION = 8
# VideoSys keeps each group's count in [min_, max_grad_accumulation_steps] ([2, 3] in its
# Open-Sora script). 2 is ours, not its 1.5: a group of one long sequence runs one micro-batch
# here, and 1.5 would then hold every group of its wave to one.
MAX_COUNT_RATIO = 2
MODES = ("inter", "intra", "both")
# Targets tried, as multiples of the step's lower bound; the fastest plan is kept.
TARGETS = (0.75, 1.0, 1.5, 2.0)


@dataclass(frozen=True)
class BucketChoice:
    """A bucket's profiled layout: one micro-batch holds `batch` sequences at `degree`."""

    degree: int
    batch: int


@dataclass
class Pending:
    """A micro-batch waiting for a group, with its degree and predicted seconds."""

    mb: MicroBatch
    degree: int
    time: float


def bucket_uppers(lengths: np.ndarray, max_len: int) -> np.ndarray:
    """Each length's bucket upper bound: the next of 2^(j / BUCKETS_PER_OCTAVE), at most max_len."""
    k = BUCKETS_PER_OCTAVE
    j = np.ceil(k * np.log2(lengths) - 1e-9)
    upper = np.floor(2.0 ** (j / k) + 1e-9).astype(np.int64)
    upper = np.where(upper < lengths, np.floor(2.0 ** ((j + 1) / k) + 1e-9).astype(np.int64), upper)
    return np.minimum(upper, max_len)


def bucket_units(upper: np.ndarray, inverse: np.ndarray, batch: SampleBatch) -> np.ndarray:
    """Attention units each bucket is profiled at: its upper length L squared times the largest
    density (units / tokens^2) of its members, so at least any member's units (it has at most
    L tokens), as DCP's profile of a bucket's upper size holds all its samples. Text under
    causal attention has density exactly 1.0, hence L^2 as before; the members' largest units
    (or units per token x L) would fall short of that and change the profiled layouts."""
    tokens = np.asarray(batch.lengths, dtype=np.float64)
    density = np.zeros(len(upper))
    np.maximum.at(density, inverse, batch.units / (tokens * tokens))
    L = upper.astype(np.float64)
    return density * L * L


@register
class DCPPlanner(Planner):
    name = "dcp"

    def _plan(self, batch: SampleBatch) -> Plan:
        lengths, mode = batch.lengths, self.options.dcp_mode
        if mode not in MODES:
            raise ValueError(f"dcp_mode must be one of {MODES}, got {mode!r}")
        max_len = self.options.max_len or max(lengths)
        if max(lengths) > max_len:
            raise ValueError(f"sequence {lengths.index(max(lengths))} has {max(lengths)} tokens, "
                             f"more than max_len {max_len}")
        level = fixed_recompute(self.cost, max_len, self.cost.degrees[-1])
        bound = lower_bound(self.cost, batch.samples)
        plans = [self.plan_for_target(batch, max_len, level, bound * f, mode) for f in TARGETS]
        return min(plans, key=lambda p: step_time(p, self.cost))

    def plan_for_target(self, batch: SampleBatch, max_len: int, level: float, target: float,
                        mode: str) -> Plan:
        """DCP's plan when bucket micro-batches may take up to `target` seconds."""
        intra, inter = mode in ("intra", "both"), mode in ("inter", "both")
        pending = self._micro_batches(batch, max_len, target, level, intra)
        waves = []
        while pending:
            groups, pending = self._wave(pending, balanced=inter)
            wave = Wave(fill_idle(groups, self.cluster.world_size))
            waves.append(pad_lockstep(wave, batch, self.cost) if self.options.lockstep else wave)
        return Plan(batch.lengths, waves, lockstep=self.options.lockstep, shapes=batch.shapes,
                    info={"mode": mode, "target_s": target, "run_recompute": level})

    # --- profile ------------------------------------------------------------------------------
    def profile(self, upper: np.ndarray, units: np.ndarray, target: float,
                levels: np.ndarray) -> list[BucketChoice]:
        """The (degree, batch size) of each bucket for a target time, its samples priced at
        `upper` tokens (memory, all-to-alls) and `units` attention units (`bucket_units`), with
        the recompute level free among `levels` (the least one a batch needs is the one that
        wins)."""
        cost = self.cost
        d = np.asarray(cost.degrees, dtype=np.float64)[None, :, None]
        c = levels[None, None, :]
        L = upper.astype(np.float64)[:, None, None]
        caps = np.array([[[cost.max_tokens(x, float(y)) for y in levels] for x in cost.degrees]])
        fit = np.floor(caps / L)
        bw = np.array([cost.bandwidth.get(x, np.inf) for x in cost.degrees])[None, :, None]
        exchanged = np.array([cost.exchange_bytes(x) for x in cost.degrees])[None, :, None]
        comm = np.where(d > 1, exchanged * L / (d * bw), 0.0) * recomputed_exchanges(c)
        per_sample = cost.work(L, units[:, None, None], c) / d + comm
        batch = np.minimum(fit, np.maximum(np.floor((target - cost.g) / per_sample), 1.0))
        time = np.maximum(batch, 1.0) * per_sample + cost.g
        valid = fit >= 1
        score = np.where(valid & (time <= target * (1 + 1e-9)), batch / (d * time), -np.inf)
        # A bucket with nothing within the target takes its fastest layout (one sequence).
        fastest = np.where(valid, per_sample, np.inf)
        choices = []
        for i in range(len(upper)):
            table = score[i] if np.isfinite(score[i].max()) else -fastest[i]
            j, k = np.unravel_index(np.argmax(table), table.shape)
            choices.append(BucketChoice(int(d[0, j, 0]), int(batch[i, j, k])))
        return choices

    def _micro_batches(self, batch: SampleBatch, max_len: int, target: float, level: float,
                       intra: bool) -> list[Pending]:
        s = np.asarray(batch.lengths, dtype=np.int64)
        buckets, inverse = np.unique(bucket_uppers(s, max_len), return_inverse=True)
        units = bucket_units(buckets, inverse, batch)
        out = []
        # Pyramid recomputation profiles every level, the fixed setting only the run's.
        blocks = self.cost.level_blocks
        levels = np.arange(blocks + 1) / blocks if intra else np.array([level])
        for b, choice in enumerate(self.profile(buckets, units, target, levels)):
            ids = np.flatnonzero(inverse == b)
            ids = ids[np.argsort(-s[ids], kind="stable")]
            for chunk in np.array_split(ids, math.ceil(len(ids) / choice.batch)):
                out.append(self._pending(chunk.tolist(), batch, choice.degree, level, intra))
        return out

    def _pending(self, seq_ids: list[int], batch: SampleBatch, degree: int, level: float,
                 intra: bool) -> Pending:
        tokens = sum(batch.lengths[i] for i in seq_ids)
        if intra:
            # Pyramid recomputation: only as much recomputation as these tokens need.
            level = self.cost.min_recompute(tokens, degree)
        assert level is not None, f"micro-batch {seq_ids} does not fit SP degree {degree}"
        time = self.cost.time_from_sums(batch.units_of(seq_ids), tokens, degree, level, samples=len(seq_ids))
        return Pending(MicroBatch(seq_ids, level), degree, time)

    # --- groups -------------------------------------------------------------------------------
    def _wave(self, pending: list[Pending], balanced: bool) -> tuple[list[Group], list[Pending]]:
        """Groups of one wave and the micro-batches left for later waves."""
        classes: dict[int, list[Pending]] = {}
        for p in sorted(pending, key=lambda p: -p.time):
            classes.setdefault(p.degree, []).append(p)
        free, admitted, deferred = self.cluster.world_size, {}, []
        for d in sorted(classes, reverse=True):
            if d <= free:
                admitted[d], free = classes[d], free - d
            else:
                deferred.extend(classes[d])
        times = {d: [p.time for p in mbs] for d, mbs in admitted.items()}
        if balanced:
            # Two estimates of a class's slowest group, neither always right: keep the
            # allocation whose dealt groups finish first.
            options = [bound_count_ratio(deal_all(admitted, allocate_groups(times, free, estimate),
                                                  deal_balanced))
                       for estimate in (lpt_bound, equal_rounds)]
            per_class, left = min(options, key=lambda o: slowest_group(o[0]))
        else:
            per_class, left = bound_count_ratio(
                deal_all(admitted, allocate_groups(times, free, per_group), deal_round_robin))
        groups: list[Group] = []
        start = 0
        for d in sorted(per_class, reverse=True):
            for mbs in per_class[d]:
                # Widest first from rank 0: every block start is a multiple of its size.
                groups.append(Group(start, d, [p.mb for p in mbs]))
                start += d
        return groups, deferred + left


Dealing = tuple[list[list[Pending]], list[Pending]]
Dealt = tuple[dict[int, list[list[Pending]]], list[Pending]]


def deal_all(classes: dict[int, list[Pending]], counts: dict[int, int],
             deal: Callable[[list[Pending], int], Dealing]) -> Dealt:
    """Each class's micro-batches dealt onto its groups; the overflow of all classes."""
    per_class, left = {}, []
    for d, mbs in classes.items():
        per_class[d], rest = deal(mbs, counts[d])
        left += rest
    return per_class, left


def bound_count_ratio(dealt: Dealt) -> Dealt:
    """`dealt` with every group cut to MAX_COUNT_RATIO x the wave's smallest non-zero count;
    the cut (each group's shortest micro-batches) joins the overflow for another wave."""
    per_class, left = dealt
    counts = [len(mbs) for groups in per_class.values() for mbs in groups if mbs]
    if not counts:
        return dealt
    cap = MAX_COUNT_RATIO * min(counts)
    # Dealt longest first, so each group's tail holds its shortest micro-batches.
    kept = {d: [mbs[:cap] for mbs in groups] for d, groups in per_class.items()}
    cut = [p for groups in per_class.values() for mbs in groups for p in mbs[cap:]]
    return kept, left + cut


def slowest_group(per_class: dict[int, list[list[Pending]]]) -> float:
    return max(sum(p.time for p in mbs) for groups in per_class.values() for mbs in groups)


# Estimates of a class's slowest group on n groups, from its micro-batch times (longest first)
# and their total. None grows with n, which allocate_groups relies on.
def lpt_bound(times: list[float], total: float, n: int) -> float:
    """A lower bound: the mean, and of the k n + 1 longest some group runs k + 1."""
    return max(total / n, max((k + 1) * times[k * n] for k in range((len(times) - 1) // n + 1)))


def equal_rounds(times: list[float], total: float, n: int) -> float:
    """As if micro-batches were equal: ceil(m / n) rounds of the mean."""
    return math.ceil(len(times) / n) * total / len(times)


def per_group(times: list[float], total: float, n: int) -> float:
    """The naive criterion: micro-batches per group, whatever they cost."""
    return len(times) / n


def allocate_groups(times: dict[int, list[float]], free: int,
                    estimate: Callable[[list[float], float, int], float]) -> dict[int, int]:
    """Groups per degree: one each, then the `free` ranks so that the worst class estimate is
    least (searched over all estimate values, so a wide group is not bought where narrow ones
    help more), then any ranks still free to whichever class is worst."""
    totals = {d: sum(t) for d, t in times.items()}
    curves = {d: [estimate(t, totals[d], n) for n in range(1, len(t) + 1)] for d, t in times.items()}

    def needed(d: int, worst: float) -> int:
        curve, lo, hi = curves[d], 1, len(curves[d])
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if curve[mid - 1] <= worst else (mid + 1, hi)
        return lo

    values = sorted({v for curve in curves.values() for v in curve})
    lo, hi = 0, len(values) - 1  # values[-1] needs one group per class: always affordable
    while lo < hi:
        mid = (lo + hi) // 2
        affordable = sum((needed(d, values[mid]) - 1) * d for d in curves) <= free
        lo, hi = (lo, mid) if affordable else (mid + 1, hi)
    counts = {d: needed(d, values[hi]) for d in curves}
    free -= sum((n - 1) * d for d, n in counts.items())
    heap = [(-curves[d][n - 1], -d) for d, n in counts.items()]
    heapq.heapify(heap)
    while heap:
        _, neg_d = heapq.heappop(heap)
        d = -neg_d
        # A class that cannot grow drops out; the others may still use the free ranks.
        if d > free or counts[d] >= len(curves[d]):
            continue
        counts[d] += 1
        free -= d
        heapq.heappush(heap, (-curves[d][counts[d] - 1], -d))
    return counts


def deal_balanced(mbs: list[Pending], groups: int) -> Dealing:
    """Longest processing time first onto the least-loaded group with room (DCP-inter)."""
    heap = [(0.0, g) for g in range(groups)]
    out: list[list[Pending]] = [[] for _ in range(groups)]
    left = []
    for p in sorted(mbs, key=lambda p: -p.time):
        if not heap:
            left.append(p)
            continue
        load, g = heapq.heappop(heap)
        out[g].append(p)
        if len(out[g]) < MAX_ACCUMULATION:
            heapq.heappush(heap, (load + p.time, g))
    return out, left


def deal_round_robin(mbs: list[Pending], groups: int) -> Dealing:
    """Equal accumulation counts: micro-batch k to group k mod groups, capped as DCP does."""
    take = mbs[:groups * MAX_ACCUMULATION]
    return [take[g::groups] for g in range(groups)], mbs[groups * MAX_ACCUMULATION:]
