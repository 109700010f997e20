"""JobMesh: how a job's ranks divide between tensor parallelism, pipeline stages and the pool the
per-step plans run on, as one validated value (torchtitan's `ParallelDims`, for plans).

A job of N ranks runs TP degree t (inside a node), PP degree p, and a pool of N / (t p) ranks:

    rank = (stage * pool + pool_index) * t + tp_index

TP is innermost: a TP group is t consecutive ranks, inside a node (t divides the node's devices),
where its per-layer all-reduces run on the fastest links. The pool comes next: a stage's pool
ranks of one TP index are t apart, so an aligned block of d pool ranks spans the d t consecutive
devices of that block (what `pool_cluster` prices its exchanges at). PP is outermost: a stage is
t * pool consecutive ranks, whole nodes or a whole share of one, so a stage's traffic stays on its
nodes and only activations cross between stages (point to point, the least traffic of the three).

Every rank of a TP group and every stage of a pipeline follow the same plan: a step's plan is a
plan over the pool (`Plan.tp` and `Plan.pp` record the mesh it was made for), and the ranks
of pool index i, whatever their stage and TP index, all run pool rank i's part of it. Each
rank belongs to one TP group (same stage and pool index), one pool (same stage and TP index:
the data-parallel dimension, over which gradients are summed and ZeRO-1 / FSDP2 shard) and one
pipeline (same pool and TP index, one rank per stage).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .cluster import Cluster
from .model_shape import ModelShape
from .pipeline_schedule import check_pipeline_shape, stage_layers


@dataclass(frozen=True)
class MeshCoordinate:
    """Where a rank sits in the mesh."""

    stage: int
    """Its pipeline stage, 0 .. p - 1."""
    pool_index: int
    """Its rank in the pool, 0 .. pool - 1: the rank the plan's groups name."""
    tp_index: int
    """Its place in its TP group, 0 .. t - 1: which shard of every split weight it holds."""


@dataclass(frozen=True)
class JobMesh:
    """The TP degree, the PP degree and the pool of a job's ranks (module docstring)."""

    world_size: int
    """Ranks of the job: t * p * pool."""
    devices_per_node: int
    """Devices of a node: a TP group must lie inside one, a stage must hold whole nodes or a
    whole share of one."""
    tp: int = 1
    """t: ranks that split every layer's weights (Megatron's tensor parallelism)."""
    pp: int = 1
    """p: pipeline stages, each holding layers / p consecutive blocks."""
    first: int = 0
    """The global rank of the mesh's rank 0: 0 for a job's mesh; a pipeline's first rank under a
    strategy (`Strategy.mesh`), whose pipelines are meshes of their own blocks of the job."""

    def __post_init__(self) -> None:
        for name in ("world_size", "devices_per_node", "tp", "pp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"job mesh: {name} must be an integer >= 1, got {value!r}")
        assert isinstance(self.first, int) and self.first >= 0, self.first
        t, p, g = self.tp, self.pp, self.devices_per_node
        if g % t:
            raise ValueError(f"TP degree {t} crosses a node: it must divide the node's {g} devices (a TP group's "
                             f"all-reduces run inside a node)")
        if self.world_size % (t * p):
            raise ValueError(f"TP degree {t} x PP degree {p} = {t * p} does not divide the world of "
                             f"{self.world_size} ranks")
        stage = self.world_size // p
        if stage % g and g % stage:
            raise ValueError(f"a pipeline stage of {stage} ranks (world {self.world_size} / PP degree {p}) "
                             f"neither holds whole nodes of {g} devices nor a whole share of one")

    @classmethod
    def of(cls, cluster: Cluster, tp: int = 1, pp: int = 1, shape: ModelShape | None = None) -> JobMesh:
        """The mesh of a job on `cluster`, checked against `shape` when given (`check_model`)."""
        mesh = cls(cluster.world_size, cluster.devices_per_node, tp, pp)
        if shape is not None:
            mesh.check_model(shape)
        return mesh

    @property
    def pool(self) -> int:
        """Ranks of the pool: what a step's plan divides into Ulysses x CP groups and waves."""
        return self.world_size // (self.tp * self.pp)

    @property
    def stage_size(self) -> int:
        """Ranks of one pipeline stage: t * pool."""
        return self.tp * self.pool

    def check_model(self, shape: ModelShape) -> None:
        """ValueError naming the value and the limit where `shape` cannot be split t ways or cut
        into p stages: TP splits the query and kv heads, the MLP's inner width and the
        vocabulary evenly over its ranks of a text model (a video model declares no split); PP cuts
        text models with untied embedding and output weights into equal runs of blocks
        (`pipeline_schedule.check_pipeline_shape`)."""
        t, p = self.tp, self.pp
        if t > 1 and shape.pattern.clips:
            raise ValueError(f"model {shape.name!r} cannot be split by tensor parallelism (text models can): run it "
                             f"without --tp")
        for what, value in (("heads", shape.heads), ("kv heads", shape.kv_heads), ("MLP width (ffn)", shape.ffn),
                            ("vocabulary", shape.vocab)):
            if value % t:
                raise ValueError(f"TP degree {t} does not divide model {shape.name!r}'s {value} {what}: each TP "
                                 f"rank holds an equal share of them")
        check_pipeline_shape(shape, p)

    def stage_layers(self, stage: int, layers: int) -> range:
        """The blocks pipeline stage `stage` holds of a model of `layers` blocks."""
        return stage_layers(stage, self.pp, layers)

    def local_heads(self, shape: ModelShape) -> int:
        """Query heads one TP rank holds, what its Ulysses part must divide."""
        return shape.heads // self.tp

    def split_why_not(self, shape: ModelShape, degree: int, cp: int = 1) -> str | None:
        """Why a pool group of `degree` ranks split Ulysses x `cp` cannot run `shape`'s attention on
        a TP rank's heads (heads / t), or None."""
        why = shape.pattern.split_why_not(degree, cp, self.local_heads(shape))
        if why is None or self.tp == 1:
            return why
        return f"{why} (a TP rank's heads: {shape.heads} / TP degree {self.tp})"

    # --- ranks ---------------------------------------------------------------------------------
    @property
    def ranks(self) -> range:
        """The global ranks of the mesh."""
        return range(self.first, self.first + self.world_size)

    def rank(self, stage: int, pool_index: int, tp_index: int) -> int:
        """The global rank at (stage, pool index, TP index): the module docstring's layout."""
        assert 0 <= stage < self.pp and 0 <= pool_index < self.pool and 0 <= tp_index < self.tp
        return self.first + (stage * self.pool + pool_index) * self.tp + tp_index

    def coordinate(self, rank: int) -> MeshCoordinate:
        """Where global rank `rank` of the mesh sits."""
        assert rank in self.ranks, (rank, self.ranks)
        local = rank - self.first
        return MeshCoordinate(local // self.stage_size, local // self.tp % self.pool, local % self.tp)

    def tp_ranks(self, rank: int) -> list[int]:
        """The ranks of `rank`'s TP group, in TP order."""
        c = self.coordinate(rank)
        return [self.rank(c.stage, c.pool_index, j) for j in range(self.tp)]

    def pool_ranks(self, rank: int) -> list[int]:
        """The ranks of `rank`'s pool, in pool order: its data-parallel group."""
        c = self.coordinate(rank)
        return [self.rank(c.stage, i, c.tp_index) for i in range(self.pool)]

    def pp_ranks(self, rank: int) -> list[int]:
        """The ranks of `rank`'s pipeline, in stage order."""
        c = self.coordinate(rank)
        return [self.rank(s, c.pool_index, c.tp_index) for s in range(self.pp)]

    def tp_groups(self) -> list[list[int]]:
        """Every TP group, in one order (a process group is made by every rank, in the same order)."""
        return [self.tp_ranks(self.rank(s, i, 0)) for s in range(self.pp) for i in range(self.pool)]

    def pools(self) -> list[list[int]]:
        """Every pool (one per stage and TP index), in one order."""
        return [self.pool_ranks(self.rank(s, 0, j)) for s in range(self.pp) for j in range(self.tp)]

    def pipelines(self) -> list[list[int]]:
        """Every pipeline (one per pool and TP index), in one order."""
        return [self.pp_ranks(self.rank(0, i, j)) for i in range(self.pool) for j in range(self.tp)]

    # --- the cluster the plans see -------------------------------------------------------------
    def pool_cluster(self, cluster: Cluster) -> Cluster:
        """The cluster a plan over the pool sees, as one TP rank of every pool rank sees it: a
        stage's pool ranks (of one TP index), each with one device's memory.

        Nodes: a stage's nodes with devices_per_node / t pool ranks each, or one node of the pool
        when a stage is a share of one. Bandwidth: a pool group of d ranks spans the d t devices of
        its block, all exchanging at once (each TP index's group moves its own heads), so each
        rank gets what an all-to-all of degree d t gets per device, `bandwidth[d t]`. NICs: the
        NICs that serve the pool's TP-index-0 devices, each serving those pool ranks, at the
        share of its bandwidth those devices hold (the other TP indices' pools move as much)."""
        self.check_cluster(cluster)
        if self.tp == 1 and self.pp == 1:
            return cluster
        per_node = self.devices_per_node // self.tp
        nodes, per_node = (self.pool // per_node, per_node) if self.pool >= per_node else (1, self.pool)
        bandwidth = {d: cluster.bandwidth[d * self.tp] for d in (1 << i for i in range(1, self.pool.bit_length()))}
        nics: dict = dict(nic_devices=None, nic_bandwidth=None)  # one node: no NIC carries its exchanges
        if nodes > 1:
            served = [[d // self.tp for d in devices if d % self.tp == 0] for devices in cluster.nic_devices]
            shares = {len(pool) / len(devices) for pool, devices in zip(served, cluster.nic_devices) if pool}
            if len(shares) > 1:
                raise ValueError(f"cluster {cluster.name!r}: its NICs serve TP degree {self.tp}'s groups unevenly "
                                 f"(nic_devices {cluster.nic_devices}); the pool's NICs would differ in bandwidth")
            nics = dict(nic_devices=[pool for pool in served if pool],
                        nic_bandwidth=cluster.nic_bandwidth * shares.pop())
        return dataclasses.replace(cluster, name=f"{cluster.name} pool (TP {self.tp}, PP {self.pp})", nodes=nodes,
                                   devices_per_node=per_node, bandwidth=bandwidth, nics_per_node=None, **nics)

    def check_cluster(self, cluster: Cluster) -> None:
        """ValueError unless this mesh was made for `cluster`'s ranks and nodes."""
        if (cluster.world_size, cluster.devices_per_node) != (self.world_size, self.devices_per_node):
            raise ValueError(f"a job mesh of {self.world_size} ranks in nodes of {self.devices_per_node} does not "
                             f"describe cluster {cluster.name!r} ({cluster.nodes} x {cluster.devices_per_node})")

    def describe(self) -> str:
        return f"TP {self.tp} x PP {self.pp} x pool {self.pool}"
