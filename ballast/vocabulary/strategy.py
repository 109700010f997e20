"""Strategy: a step's heterogeneous parallel layout, Hydraulis' "strategy" (docs/design.md, section 3,
*Strategies*): several pipelines side by side, each with its own TP degree t, PP degree p and pool,
together covering the job's ranks, as one validated value.

Pipelines sit in the order given, each on a contiguous block of t * p * pool ranks laid out as a
`JobMesh` of its own (TP innermost, then the pool, then the stages), so a pipeline's ranks are

    rank = start + (stage * pool + pool_index) * t + tp_index

A homogeneous mesh is the strategy of one pipeline (`Strategy.of_mesh`). Hydraulis places each stage
on the first node with room (Hetu's `convert_strategy`); here blocks are contiguous, which the user
orders (largest TP first keeps every block aligned), and the checks say where one breaks a node.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .cluster import Cluster
from .job_mesh import JobMesh
from .model_shape import ModelShape
from .value_checks import Numbers

DEGREE = Numbers(int, 1)
"""What t, p and a pool may be."""


@dataclass(frozen=True)
class PipelineLayout:
    """One pipeline of a strategy: its degrees and pool (where it sits is the strategy's order)."""

    tp: int
    """t: ranks that split each of its layers' weights, inside a node."""
    pp: int
    """p: its stages, each holding layers / p consecutive blocks."""
    pool: int = 1
    """Ranks of each stage (per TP index) that a plan divides into Ulysses x CP groups: 1 is one
    model replica, Hydraulis' pipeline."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "pool"):
            DEGREE.check(f"pipeline {self.label}: {name}", getattr(self, name))

    @property
    def size(self) -> int:
        """Ranks it holds: t * p * pool."""
        return self.tp * self.pp * self.pool

    @property
    def label(self) -> str:
        """"(t,p)", or "(t,p)xpool" for a pool wider than one rank."""
        base = f"({self.tp},{self.pp})"
        return base if self.pool == 1 else f"{base}x{self.pool}"


@dataclass(frozen=True)
class Strategy:
    """Pipelines side by side covering a job's ranks (module docstring)."""

    pipelines: tuple[PipelineLayout, ...]

    def __post_init__(self) -> None:
        if not self.pipelines:
            raise ValueError("a strategy holds at least one pipeline")
        assert all(isinstance(p, PipelineLayout) for p in self.pipelines), self.pipelines

    @classmethod
    def of_mesh(cls, mesh: JobMesh) -> Strategy:
        """The strategy of a homogeneous job mesh: one pipeline of its t, p and pool."""
        return cls((PipelineLayout(mesh.tp, mesh.pp, mesh.pool),))

    @classmethod
    def parse(cls, text: str) -> Strategy:
        """A strategy from its command-line form, pipelines as "TxP" or "TxPxPOOL" separated by
        commas ("2x2,2x1,1x1,1x1"), or Hydraulis' list of pairs ("[(2,2),(2,1),(1,1),(1,1)]")."""
        spec = text.strip()
        pairs = re.fullmatch(r"\[\s*(\(\s*\d+\s*,\s*\d+\s*\)\s*,?\s*)+\]", spec)
        items = re.findall(r"\((\d+)\s*,\s*(\d+)\)", spec) if pairs else [item.split("x") for item in spec.split(",")]
        pipelines = []
        for item in items:
            if not 2 <= len(item) <= 3 or not all(part.strip().isdigit() for part in item):
                raise ValueError(f"strategy {text!r}: {'x'.join(item)!r} is not a pipeline; write TxP or TxPxPOOL "
                                 f"(\"2x2,2x1,1x1,1x1\") or a list of (t,p) pairs (\"[(2,2),(1,4)]\")")
            pipelines.append(PipelineLayout(*(int(part) for part in item)))
        return cls(tuple(pipelines))

    @property
    def world_size(self) -> int:
        return sum(p.size for p in self.pipelines)

    @property
    def homogeneous(self) -> bool:
        """Whether every pipeline has the same t and p."""
        return len({(p.tp, p.pp) for p in self.pipelines}) == 1

    def starts(self) -> list[int]:
        """The first rank of each pipeline's block."""
        out, at = [], 0
        for p in self.pipelines:
            out.append(at)
            at += p.size
        return out

    def ranks(self, index: int) -> range:
        """Pipeline `index`'s ranks."""
        start = self.starts()[index]
        return range(start, start + self.pipelines[index].size)

    def pipeline_of(self, rank: int) -> int:
        """The index of the pipeline holding global rank `rank`."""
        assert 0 <= rank < self.world_size, rank
        return next(i for i in range(len(self.pipelines)) if rank in self.ranks(i))

    def mesh(self, index: int, cluster: Cluster) -> JobMesh:
        """Pipeline `index` as a job mesh of its block's cluster (`block_cluster`), its ranks the
        block's global ones (`JobMesh.first`)."""
        p = self.pipelines[index]
        mesh = JobMesh.of(self.block_cluster(index, cluster), p.tp, p.pp)
        return dataclasses.replace(mesh, first=self.starts()[index])

    def block_cluster(self, index: int, cluster: Cluster) -> Cluster:
        """Pipeline `index`'s ranks of `cluster` as a cluster of their own, what its plans and cost
        model see: one node of its ranks where the block lies inside a node (its exchanges and its
        ring at that node's all-to-all rates), else its whole nodes with their NICs. ValueError
        naming the pipeline for a block that does neither, or one inside a node whose size is no
        power of two (a node's devices are)."""
        p, start, g = self.pipelines[index], self.starts()[index], cluster.devices_per_node
        where = f"strategy {self}: pipeline {index} {p.label} (ranks {start}..{start + p.size - 1})"
        if not _inside_node(start, p.size, g):
            raise ValueError(f"{where} neither lies inside one node of {g} devices nor holds whole nodes, so it has "
                             f"no cluster of its own to price; order the pipelines largest first")
        if p.size >= g:
            bandwidth = {d: b for d, b in cluster.bandwidth.items() if d <= p.size}
            return dataclasses.replace(cluster, name=f"{cluster.name} {p.label}", nodes=p.size // g,
                                       bandwidth=bandwidth)
        if p.size & (p.size - 1):
            raise ValueError(f"{where}: a block inside a node holds a power of two of its ranks, not {p.size}")
        return dataclasses.replace(cluster, name=f"{cluster.name} {p.label}", nodes=1, devices_per_node=p.size,
                                   bandwidth={d: b for d, b in cluster.bandwidth.items() if d <= p.size},
                                   nics_per_node=None, nic_bandwidth=None, nic_devices=None, ring_bandwidth=None)

    def check(self, cluster: Cluster, shape: ModelShape | None = None) -> None:
        """ValueError naming the pipeline and the limit unless the strategy covers `cluster`'s
        ranks exactly, every TP group and every stage of every pipeline stays inside a node or
        holds whole nodes, and (with `shape`) every pipeline's t and p can split the model
        (`JobMesh.check_model`)."""
        if self.world_size != cluster.world_size:
            raise ValueError(f"strategy {self} holds {self.world_size} ranks, but cluster {cluster.name!r} has "
                             f"{cluster.world_size}: its pipelines must cover the world exactly")
        g = cluster.devices_per_node
        for i, (p, start) in enumerate(zip(self.pipelines, self.starts())):
            where = f"strategy {self}: pipeline {i} {p.label} (ranks {start}..{start + p.size - 1})"
            try:  # its own mesh refuses a TP degree crossing a node, and (with `shape`) the model's limits
                mesh = JobMesh(p.size, g, p.tp, p.pp)
                if shape is not None:
                    mesh.check_model(shape)
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from None
            stage = p.tp * p.pool
            for k in range(p.pp):
                first = start + k * stage
                if not _inside_node(first, stage, g):
                    raise ValueError(f"{where}: stage {k} (ranks {first}..{first + stage - 1}) neither lies inside "
                                     f"one node of {g} devices nor holds whole nodes; order the pipelines largest "
                                     f"TP first, or make the pipelines' blocks whole nodes")

    def to_list(self) -> list[list[int]]:
        """[[t, p], ...] (with the pool as a third entry where it is wider than one rank)."""
        return [[p.tp, p.pp] + ([p.pool] if p.pool > 1 else []) for p in self.pipelines]

    @classmethod
    def from_list(cls, data: list) -> Strategy:
        if not isinstance(data, list) or not all(isinstance(item, list) and 2 <= len(item) <= 3 for item in data):
            raise ValueError(f"a strategy is a list of [t, p] or [t, p, pool] lists, got {data!r}")
        return cls(tuple(PipelineLayout(*item) for item in data))

    def spec(self) -> str:
        """Its command-line form ("2x2,2x1,1x1x2"), which `parse` reads back."""
        return ",".join("x".join(map(str, item)) for item in self.to_list())

    def __str__(self) -> str:
        return "[" + ",".join(p.label for p in self.pipelines) + "]"


def _inside_node(first: int, size: int, per_node: int) -> bool:
    """Whether ranks first..first+size-1 lie inside one node, or are whole nodes."""
    if size <= per_node:
        return first // per_node == (first + size - 1) // per_node
    return first % per_node == 0 and size % per_node == 0
