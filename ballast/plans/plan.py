"""The plan of one optimizer step: the one contract between planners, simulator and runtime.

    Plan  -> waves, run one after another
    Wave  -> groups, disjoint aligned power-of-two blocks of ranks covering the cluster
    Group -> micro-batches, run one after another by the group's ranks (its SP degree = size)
    MicroBatch -> sequences packed into one token stream, and a recompute level

Plans are plain data: `to_dict`/`from_dict` round-trip through JSON, `table()` prints them.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

from ..pricing import remapping
from ..vocabulary.cluster import Cluster, is_power_of_two
from ..pricing.cost import CostModel
from ..pricing.pipeline import stage_activation_bytes, stage_memory
from ..vocabulary.pipeline_schedule import recomputed_blocks
from ..pricing.remapping import MEMORY_SLACK, SlotPart
from ..vocabulary.samples import Sample, check_samples, tokens as sample_tokens


class PlanError(ValueError):
    """A plan that breaks an invariant; the message names the wave, group and sequence."""


@dataclass
class MicroBatch:
    seq_ids: list[int]
    """Indices into `Plan.lengths` of the sequences packed together."""
    recompute: float = 0.0
    """Fraction of layers whose activations are recomputed in backward (0..1)."""


@dataclass
class Group:
    start: int
    """First rank of the block; divisible by `degree`."""
    degree: int
    """Number of ranks = SP degree; a power of two."""
    micro_batches: list[MicroBatch] = field(default_factory=list)
    """Run one after another; their count is this group's gradient-accumulation count."""
    cp: int = 1
    """c, the context-parallel part of the degree: attention runs Ulysses over `ulysses`
    contiguous ranks times context parallelism over `cp` ranks spanning them (`layouts.CONTEXT`);
    1 is Ulysses (or the model's own layout) alone over the whole group."""

    @property
    def ranks(self) -> range:
        return range(self.start, self.start + self.degree)

    @property
    def ulysses(self) -> int:
        """u = degree / cp: ranks of each Ulysses sub-group (the head-sharded part)."""
        return self.degree // self.cp

    @property
    def split(self) -> str:
        return split_label(self.degree, self.cp)


@dataclass
class Wave:
    groups: list[Group]
    """Disjoint; together they cover every rank (a group with no micro-batches is idle)."""
    remap: list[tuple[int, int]] = field(default_factory=list)
    """Remap domains (start, size): the cluster, or aligned blocks of ranks, whose groups run micro-batch slot
    by slot and spread each slot's tokens evenly over the block for everything but attention
    (Zeppelin's remapping layer; `ballast.runtime.remap`). A group lies inside one or none."""
    routed: bool = False
    """The wave's all-to-alls that cross nodes (Ulysses exchanges of groups wider than a node,
    token moves of remap domains wider than a node) go over every NIC of the node, not only the
    sending rank's (Zeppelin's routing layer: `ballast.runtime.routing`, priced by `ballast.pricing.nics`).
    CP all-gathers stay unrouted: every rank of a group sends alike, so they load the NICs of its
    nodes as evenly as the cluster's NIC layout allows."""

    def domain_groups(self, start: int, size: int) -> list[Group]:
        """The groups inside the domain (start, size), by first rank."""
        return sorted((g for g in self.groups if start <= g.start < start + size), key=lambda g: g.start)

    def domain_of(self, rank: int) -> tuple[int, int] | None:
        return next(((s, n) for s, n in self.remap if s <= rank < s + n), None)

    def crosses_nodes(self, per_node: int) -> bool:
        """Whether some all-to-all of the wave crosses nodes of `per_node` ranks (a group or a
        remap domain wider than a node): what `routed` would route."""
        return any(g.degree > per_node and g.micro_batches for g in self.groups) or \
            any(size > per_node for _, size in self.remap)


@dataclass
class Plan:
    lengths: list[int]
    """Tokens of every sequence of the global batch; a sequence id is an index here."""
    waves: list[Wave]
    tokens: int = -1
    """Loss tokens of the whole global batch, the loss normaliser; defaults to sum(lengths)."""
    lockstep: bool = False
    """Every group of a wave runs the same number of micro-batches (FSDP/ZeRO-3)."""
    planner: str = ""
    """Name of the planner that made the plan, for reports."""
    info: dict = field(default_factory=dict)
    """Planner-specific facts (solver gap, chosen degree, ...), carried into reports."""
    shapes: list[Sample] | None = None
    """Every sample as planned (`samples.Sample`) when the batch holds video clips, whose
    attention work follows their (frames, height, width); None: text only, `lengths` is all."""
    tp: int = 1
    """The TP degree of the job the plan was made for (`vocabulary.job_mesh.JobMesh`): its ranks
    are the pool's, each a TP group of `tp` devices that all run the rank's part; its groups'
    Ulysses parts divide a TP rank's heads, its memory is a TP shard's (JSON key "tp" only > 1)."""
    pp: int = 1
    """The PP degree of that job: every stage runs the plan (JSON key "pp" only > 1)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int) \
                    or getattr(self, name) < 1:
                raise PlanError(f"plan {name} {getattr(self, name)!r} must be an integer >= 1")
        self.lengths = [int(s) for s in self.lengths]
        if self.tokens < 0:
            self.tokens = sum(self.lengths)
        if self.shapes is not None:
            self.shapes = check_samples(self.shapes)
            if [sample_tokens(x) for x in self.shapes] != self.lengths:
                raise PlanError("plan shapes do not match its lengths (tokens of every sample)")

    @property
    def samples(self) -> list[Sample]:
        """What the cost model prices: the shapes of a video batch, else the lengths."""
        return self.lengths if self.shapes is None else self.shapes

    # --- queries ------------------------------------------------------------------------------
    def micro_batches(self) -> Iterator[tuple[int, Group, MicroBatch]]:
        for w, wave in enumerate(self.waves):
            for group in wave.groups:
                for mb in group.micro_batches:
                    yield w, group, mb

    def slots(self) -> list[tuple[int, int, list[tuple[Group, MicroBatch]]]]:
        """The step's micro-batches in the order a pipeline runs them (`runtime/pipeline`; the
        timeline under PP): wave by wave, every group's first micro-batch, then every group's
        second, ... up to the wave's longest group; each slot as (wave, position i, every group
        of the wave with its i-th micro-batch, empty past the group's last)."""
        return [(w, i, [(g, g.micro_batches[i] if i < len(g.micro_batches) else MicroBatch([])) for g in wave.groups])
                for w, wave in enumerate(self.waves)
                for i in range(max((len(g.micro_batches) for g in wave.groups), default=0))]

    def mb_lengths(self, mb: MicroBatch) -> list[int]:
        return [self.lengths[i] for i in mb.seq_ids]

    def mb_samples(self, mb: MicroBatch) -> list[Sample]:
        samples = self.samples
        return [samples[i] for i in mb.seq_ids]

    def degrees_used(self) -> list[int]:
        return sorted({g.degree for _, g, mb in self.micro_batches() if mb.seq_ids})

    def context_parts_used(self) -> list[int]:
        """The CP parts (`Group.cp`) of the groups that run something; [1] for Ulysses alone."""
        return sorted({g.cp for _, g, mb in self.micro_batches() if mb.seq_ids})

    def busy_micro_batches(self) -> int:
        """Micro-batches that hold sequences (lockstep padding and idle groups hold none)."""
        return sum(1 for _, _, mb in self.micro_batches() if mb.seq_ids)

    def recomputed_fraction(self) -> float:
        """Recompute level averaged over the plan's tokens: the share of layer work recomputed."""
        weighted = sum(sum(self.mb_lengths(mb)) * mb.recompute for _, _, mb in self.micro_batches())
        return weighted / max(1, sum(sum(self.mb_lengths(mb)) for _, _, mb in self.micro_batches()))

    def group_of(self, wave: int, rank: int) -> Group:
        for group in self.waves[wave].groups:
            if rank in group.ranks:
                return group
        raise PlanError(f"wave {wave}: no group holds rank {rank}")

    # --- invariants ---------------------------------------------------------------------------
    def validate(self, cluster: Cluster, cost: CostModel | None = None) -> None:
        """Raise PlanError unless the plan is executable on `cluster`, the cluster of the pool its
        ranks are (`JobMesh.pool_cluster`: the job's own without TP or PP), and fits memory under
        `cost`, whose coefficients are a rank's of the mesh the plan was made for (a TP shard's):
        each micro-batch at its degree, or under PP every rank on every stage, its stage's states
        and the micro-batches 1F1B holds there at once (`_validate_stage_memory`)."""
        if cost is not None:
            priced = (cost.mesh.tp, cost.mesh.pp) if cost.mesh is not None else (1, 1)
            if (self.tp, self.pp) != priced:
                raise PlanError(f"plan made for TP degree {self.tp} and PP degree {self.pp}, but the cost model "
                                f"prices a rank of TP degree {priced[0]} and PP degree {priced[1]}")
        n = cluster.world_size
        seen: dict[int, str] = {}
        for w, wave in enumerate(self.waves):
            covered = [False] * n
            counts = set()
            for g, group in enumerate(wave.groups):
                where = f"wave {w}, group {g} (ranks {group.start}..{group.start + group.degree - 1})"
                if not is_power_of_two(group.degree):
                    raise PlanError(f"{where}: size {group.degree} is not a power of two")
                if group.start % group.degree:
                    raise PlanError(f"{where}: not aligned: start {group.start} is not divisible by "
                                    f"size {group.degree}")
                if group.start < 0 or group.start + group.degree > n:
                    raise PlanError(f"{where}: outside the cluster's {n} ranks")
                for r in group.ranks:
                    if covered[r]:
                        raise PlanError(f"{where}: rank {r} is also in another group of the wave")
                    covered[r] = True
                if not is_power_of_two(group.cp) or group.degree % group.cp:
                    raise PlanError(f"{where}: CP part {group.cp} is not a power of two dividing the "
                                    f"group's size {group.degree}")
                busy = any(mb.seq_ids for mb in group.micro_batches)
                if busy and cost is not None and (why := cost.pattern.split_why_not(group.degree, group.cp, cost.heads)):
                    raise PlanError(f"{where}: {why}")
                counts.add(len(group.micro_batches))
                # A remap domain's memory is its slots' (`remap_overflow`), not each group's own; a
                # pipeline's is its stages' (`_validate_stage_memory`).
                own = None if wave.domain_of(group.start) or (cost is not None and cost.stages) else cost
                for m, mb in enumerate(group.micro_batches):
                    self._validate_micro_batch(f"{where}, micro-batch {m}", mb, group, own, seen)
            if not all(covered):
                raise PlanError(f"wave {w}: rank {covered.index(False)} is in no group")
            self._validate_remap(w, wave, n)
            if wave.routed and cluster.nodes == 1:
                raise PlanError(f"wave {w} is routed, but cluster {cluster.name!r} is one node: no exchange "
                                f"crosses nodes")
            for start, size in wave.remap if cost is not None else ():
                if (why := self.remap_overflow(w, start, size, cost)) is not None:
                    raise PlanError(f"wave {w}, remap domain ranks {start}..{start + size - 1}: {why}")
            if self.lockstep and len(counts) > 1:
                raise PlanError(f"wave {w}: lockstep plan but groups run {sorted(counts)} micro-batches")
        if cost is not None and cost.stages is not None:
            self._validate_stage_memory(cost, n)
        missing = [i for i in range(len(self.lengths)) if i not in seen]
        if missing:
            raise PlanError(f"sequence {missing[0]} ({self.lengths[missing[0]]} tokens) is in no micro-batch"
                            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        if self.tokens <= 0 and self.lengths:
            raise PlanError(f"loss normaliser tokens={self.tokens} must be positive")

    # --- remap domains (priced by `remapping.py`) ---------------------------------------------------
    def slot_parts(self, wave: Wave, start: int, size: int) -> list[list[SlotPart]]:
        """Every slot of the remap domain (start, size) of a wave of this plan: the busy
        micro-batches of its groups (in the wave's order) that run in it."""
        groups = [g for g in wave.groups if start <= g.start < start + size]
        return [[SlotPart(g.start, g.degree, self.mb_samples(g.micro_batches[m]), g.micro_batches[m].recompute, g.cp)
                 for g in groups if m < len(g.micro_batches) and g.micro_batches[m].seq_ids]
                for m in range(max((len(g.micro_batches) for g in groups), default=0))]

    def slot_loads(self, wave: int, start: int, size: int, cost: CostModel) -> list[tuple[float, int, float]]:
        """`remapping.slot_load` of every slot of the remap domain (start, size) of a wave."""
        return [remapping.slot_load(cost, parts, size) for parts in self.slot_parts(self.waves[wave], start, size)]

    def remap_overflow(self, wave: int, start: int, size: int, cost: CostModel) -> str | None:
        """Why the remap domain (start, size) of a wave would not fit device memory, or None
        (`remapping.overflow`)."""
        return remapping.overflow(cost, self.slot_loads(wave, start, size, cost))

    def leveled(self, wave: int, domain: tuple[int, int], cost: CostModel) -> list[Group] | None:
        """Copies of the domain's groups with every slot's micro-batches at the least recompute
        level that slot fits at (`remapping.levels`); None if some slot fits at none."""
        levels = remapping.levels(cost, self.slot_loads(wave, *domain, cost))
        if any(level is None for level in levels):
            return None
        return [dataclasses.replace(g, micro_batches=[dataclasses.replace(mb, recompute=level if mb.seq_ids else 0.0)
                                                      for mb, level in zip(g.micro_batches, levels)])
                for g in self.waves[wave].domain_groups(*domain)]

    @staticmethod
    def _validate_remap(w: int, wave: Wave, n: int) -> None:
        taken = [False] * n
        for start, size in wave.remap:
            where = f"wave {w}, remap domain ranks {start}..{start + size - 1}"
            whole = (start, size) == (0, n)
            if size < 2 or not whole and (not is_power_of_two(size) or start % size or start < 0 or start + size > n):
                raise PlanError(f"{where}: neither the whole cluster nor an aligned power-of-two block "
                                f"of 2 or more of its {n} ranks")
            if any(taken[start:start + size]):
                raise PlanError(f"{where}: overlaps another remap domain of the wave")
            taken[start:start + size] = [True] * size
            for group in wave.groups:
                if group.start < start + size and start < group.start + group.degree and \
                        not (start <= group.start and group.start + group.degree <= start + size):
                    raise PlanError(f"{where}: group of ranks {group.start}..{group.start + group.degree - 1} "
                                    f"is partly outside it")

    def _validate_stage_memory(self, cost: CostModel, ranks: int) -> None:
        """PlanError unless every pool rank fits on every pipeline stage (`cost.stages`): its
        stage's states and the most activations 1F1B holds there at once
        (`pipeline.stage_memory`), every micro-batch keeping its stage's share of the layers' at a
        level a stage runs as priced: a whole number of its blocks (`CostModel.level_blocks`)."""
        stages, slots, blocks = cost.stages, self.slots(), cost.level_blocks
        for w, i, parts in slots:
            for group, mb in (part for part in parts if part[1].seq_ids):
                if abs(mb.recompute * blocks - round(mb.recompute * blocks)) > 1e-6:
                    raise PlanError(f"wave {w}, group at rank {group.start}, micro-batch {i}: recompute level "
                                    f"{mb.recompute:g} is no whole number of a stage's {blocks} blocks, which the "
                                    f"stage would run as {recomputed_blocks(mb.recompute, blocks)} of them")
        for k in range(stages.count):
            held = [[0.0] * len(slots) for _ in range(ranks)]
            for i, (_, _, parts) in enumerate(slots):
                for group, mb in (part for part in parts if part[1].seq_ids):
                    kept = stage_activation_bytes(cost, self.mb_samples(mb), group.degree, mb.recompute, group.cp, k,
                                                  stages.count)
                    for r in group.ranks:
                        held[r][i] = kept
            for r, activations in enumerate(held):
                if (used := stage_memory(stages, k, activations)) > cost.device_memory * (1 + MEMORY_SLACK):
                    raise PlanError(
                        f"pipeline stage {k}, pool rank {r}: needs {used / 1e9:.2f} GB per device at its peak "
                        f"({stages.states[k] / 1e9:.2f} GB states and the activations of the micro-batches 1F1B "
                        f"holds at once); the device has {cost.device_memory / 1e9:.2f} GB")

    def _validate_micro_batch(self, where: str, mb: MicroBatch, group: Group,
                              cost: CostModel | None, seen: dict[int, str]) -> None:
        if not 0.0 <= mb.recompute <= 1.0:
            raise PlanError(f"{where}: recompute level {mb.recompute} is outside 0..1")
        for i in mb.seq_ids:
            if not 0 <= i < len(self.lengths):
                raise PlanError(f"{where}: sequence {i} is not in the batch of {len(self.lengths)}")
            if i in seen:
                raise PlanError(f"{where}: sequence {i} already appears in {seen[i]}")
            seen[i] = where
        if cost is not None and mb.seq_ids:
            lengths = self.mb_lengths(mb)
            used = cost.memory(lengths, group.degree, mb.recompute, group.cp)
            if used > cost.device_memory * (1 + MEMORY_SLACK):
                raise PlanError(
                    f"{where}: sequences {mb.seq_ids[:8]}{'...' if len(mb.seq_ids) > 8 else ''} "
                    f"({sum(lengths)} tokens) need {used / 1e9:.2f} GB per device at SP degree "
                    f"{group.degree}{f' (CP {group.cp})' if group.cp > 1 else ''} and recompute {mb.recompute:.2f}; the device has "
                    f"{cost.device_memory / 1e9:.2f} GB")

    # --- plain data ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "planner": self.planner, "tokens": self.tokens, "lockstep": self.lockstep,
            "lengths": self.lengths, "info": self.info,
            **({} if self.shapes is None else {"shapes": [x if isinstance(x, int) else list(x) for x in self.shapes]}),
            **({"tp": self.tp} if self.tp > 1 else {}), **({"pp": self.pp} if self.pp > 1 else {}),
            "remap": [[w, start, size] for w, wave in enumerate(self.waves) for start, size in wave.remap],
            **({"routed": routed} if (routed := [w for w, wave in enumerate(self.waves) if wave.routed]) else {}),
            "waves": [[{"start": g.start, "degree": g.degree, **({"cp": g.cp} if g.cp != 1 else {}),
                        "micro_batches": [{"seq_ids": list(mb.seq_ids), "recompute": mb.recompute}
                                          for mb in g.micro_batches]}
                       for g in wave.groups] for wave in self.waves],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Plan:
        try:
            waves = [Wave([Group(int(g["start"]), int(g["degree"]),
                                 [MicroBatch([int(i) for i in mb["seq_ids"]], _recompute_of(mb))
                                  for mb in g["micro_batches"]], int(g.get("cp", 1)))
                           for g in wave]) for wave in data["waves"]]
            for w, start, size in data.get("remap", []):
                waves[int(w)].remap.append((int(start), int(size)))
            for w in data.get("routed", []):
                waves[int(w)].routed = True
            return cls(list(data["lengths"]), waves, int(data["tokens"]), bool(data["lockstep"]),
                       str(data.get("planner", "")), dict(data.get("info", {})), data.get("shapes"),
                       int(data.get("tp", 1)), int(data.get("pp", 1)))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise PlanError(f"malformed plan data: missing or wrong field {e}") from e

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))

    def table(self, max_rows: int = 40) -> str:
        """A compact text table: one row per busy group of every wave."""
        head = (f"plan by {self.planner or '?'}: {len(self.lengths)} sequences, {self.tokens} tokens, "
                f"{len(self.waves)} wave(s){', lockstep' if self.lockstep else ''}")
        if (self.tp, self.pp) != (1, 1):
            head += f"; ranks of the pool of TP {self.tp} x PP {self.pp}"
        remapped = [f"wave {w} ranks {start}-{start + size - 1}" for w, wave in enumerate(self.waves)
                    for start, size in wave.remap]
        if remapped:
            head += f"; linear work remapped over {', '.join(remapped)}"
        routed = [str(w) for w, wave in enumerate(self.waves) if wave.routed]
        if routed:
            head += f"; inter-node exchanges routed over every NIC in wave(s) {', '.join(routed)}"
        rows = [f"{'wave':>4} {'ranks':>9} {'deg':>4} {'mbs':>4} {'seqs':>5} {'tokens':>9} {'recomp':>6}  longest"]
        for w, wave in enumerate(self.waves):
            for g in wave.groups:
                busy = [mb for mb in g.micro_batches if mb.seq_ids]
                if not busy:
                    continue
                lengths = [self.lengths[i] for mb in busy for i in mb.seq_ids]
                recomputed = sum(mb.recompute for mb in busy) / len(busy)
                rows.append(f"{w:>4} {f'{g.start}-{g.start + g.degree - 1}':>9} {g.split:>4} "
                            f"{len(g.micro_batches):>4} {len(lengths):>5} {sum(lengths):>9} {recomputed:>6.2f}  "
                            f"{max(lengths)}")
        if len(rows) > max_rows + 1:
            rows = rows[:max_rows + 1] + [f"... {len(rows) - 1 - max_rows} more groups"]
        return "\n".join([head, *rows])


def split_label(degree: int, cp: int) -> str:
    """A degree as every log and table prints it: u x c ("1x2") with a CP part c, the degree
    alone ("2") for Ulysses alone."""
    return f"{degree // cp}x{cp}" if cp > 1 else str(degree)


def degree_splits(plans: Iterable[Plan]) -> list[tuple[int, int]]:
    """The (degree, CP part) of the plans' busy groups, by degree."""
    return sorted({(g.degree, g.cp) for plan in plans for _, g, mb in plan.micro_batches() if mb.seq_ids})


def splits_used(plans: Iterable[Plan]) -> list[str]:
    """The degrees the plans' busy groups run at, as u x c (`split_label`), by degree."""
    return [split_label(degree, cp) for degree, cp in degree_splits(plans)]


def fill_idle(groups: Sequence[Group], world_size: int) -> list[Group]:
    """The wave's groups plus idle single-rank groups on every rank no group covers."""
    covered = [False] * world_size
    for g in groups:
        for r in g.ranks:
            covered[r] = True
    idle = [Group(r, 1) for r in range(world_size) if not covered[r]]
    return sorted([*groups, *idle], key=lambda g: g.start)


def _recompute_of(mb: dict) -> float:
    """A recorded micro-batch's recompute level: its "recompute", or "checkpoint" in plans written
    before that key was renamed."""
    return float(mb["checkpoint" if "checkpoint" in mb else "recompute"])
