"""Process groups for every aligned power-of-two block of ranks and every (u, c) split of it,
created once at start-up; under tensor parallelism, of the pool's ranks, and the TP groups.

A plan may put any aligned block (start divisible by its size) into a sequence-parallel
group, and a different one in every wave. Creating a group is a collective of the whole world
(`dist.new_group` must be called by every rank, members or not, in the same order) and costs a
rendezvous, so it cannot happen in the step loop: `ProcessGroups` makes all of them in one
fixed order when the job starts and the executor only looks them up by (start, degree).
A world of N ranks has N/2 + N/4 + ... + 1 = N - 1 such blocks of two or more ranks.

A block of degree d split as u Ulysses x c context-parallel ranks (`plans.Group.cp`, 1 < c < d)
needs its Ulysses sub-groups, the contiguous blocks of u ranks (aligned blocks, already made),
and its u CP groups, the strided ranks {start + i + j u : j < c} for i < u. Those are
d/2 + d/4 + ... + 2 = d - 2 groups per block (c = d is the block itself), N - 2N/d per degree:
for N = 64, 258 strided groups besides the 63 blocks (321 in all, each a world rendezvous at
start-up; no two splits share a strided group).

Under NCCL the world is bound to the rank's GPU (`world._init_process_group`'s `device_id`), so
each of these groups is split from the world's communicator and connected as it is made, here,
at start-up: not lazily at its first collective in some step (0.1 s to seconds each), and with
its buffers taken before any step measures the memory left.

Every group gets the world's collective timeout (`world_timeout`): `new_group` without one
falls back to torch's defaults (30 minutes under gloo, 10 under NCCL), so a dead peer in a
sequence-parallel all-to-all would hang for that long whatever `--timeout` said.

Under a `JobMesh` with TP or PP the blocks are of the pool (`JobMesh.pool_ranks`): a plan's
ranks are pool ranks, and the ranks of every TP index and stage run their own copy of each
group (t p copies of every block, each made by every rank); `rank` and `world_size` are then
the pool's, and `tensor` is the rank's TP group.

Under a strategy (`vocabulary/strategy.py`) each pipeline is a mesh of its own block of the job's
ranks (`JobMesh.first`): every rank makes every pipeline's groups, in the strategy's order, and
keeps its own pipeline's (`member`); `job` is the mesh's ranks, the world for a job's mesh, which
the executor's barriers and step statistics run over.

`gradients` is one more group of the whole pool, for the gradient buckets alone
(`grad_sync.py`): their collectives are issued from backward hooks, at times that differ from
rank to rank, so they must not share a communicator with any exchange (a group spanning the
world is `WORLD`) or barrier, whose order the plan fixes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed import ProcessGroup

from ..vocabulary.cluster import Cluster
from ..vocabulary.job_mesh import JobMesh
from ..vocabulary.strategy import Strategy
from .world import world_timeout


@dataclass(frozen=True)
class ContextGroups:
    """This rank's process groups in a group split u x c (`ProcessGroups.get` with cp > 1)."""

    ulysses: ProcessGroup | None
    """Its Ulysses sub-group (contiguous u ranks); None when u = 1."""
    context: ProcessGroup
    """Its CP group (c ranks, u apart)."""
    cp: int
    block: ProcessGroup
    """The whole group (u c ranks): a spatial-temporal DiT's layout switches span it."""


class ProcessGroups:
    """Cache of the process groups of all aligned power-of-two blocks of the pool (the default
    world without tensor or pipeline parallelism), and of this rank's TP group."""

    def __init__(self, mesh: JobMesh | None = None, *, block: bool = False) -> None:
        """The groups of `mesh` (None: the world one pool), which covers the job's ranks, or with
        `block` is one pipeline's block of them (`of_strategy`)."""
        timeout = world_timeout()
        if not dist.is_initialized() or timeout is None:
            raise ValueError("ProcessGroups needs torch.distributed to be initialised first, by "
                             "ballast.runtime.init_distributed or run_local (they record its timeout)")
        world = dist.get_world_size()
        self.mesh = mesh or JobMesh(world, world)
        """The job's mesh (or a strategy pipeline's): plans' ranks are its pool's; a world of one
        pool when not given."""
        if (self.mesh.ranks != range(world)) if not block else self.mesh.ranks.stop > world:
            raise ValueError(f"job mesh of ranks {self.mesh.first}..{self.mesh.ranks.stop - 1}, but the job has "
                             f"{world}")
        me = dist.get_rank()
        self.member = me in self.mesh.ranks
        """Whether this rank is one of the mesh's (always, but for another pipeline's groups)."""
        self.world_size = self.mesh.pool
        """Ranks of the pool, what plans' groups divide."""
        self.rank = self.mesh.coordinate(me).pool_index if self.member else -1
        """This rank's pool rank, the rank plans name (-1 outside the mesh)."""
        self._groups: dict[tuple[int, int], ProcessGroup] = {}
        self._strided: dict[tuple[int, int, int], ProcessGroup] = {}
        """(first rank, stride u, c) -> the CP group of those c ranks."""

        def made(ranks: list[int]) -> ProcessGroup | None:
            """The group of global `ranks` (every rank calls it, in one order: new_group's
            collective contract); kept only by its members."""
            group = dist.group.WORLD if len(ranks) == world else dist.new_group(ranks, timeout=timeout)
            return group if me in ranks else None

        def mine(groups: list[ProcessGroup | None]) -> ProcessGroup | None:
            return next((g for g in groups if g is not None), None)

        self.job = made(list(self.mesh.ranks))
        """The mesh's ranks: the world for a job's mesh, a pipeline's block under a strategy."""
        gradients = [dist.new_group(pool, timeout=timeout) for pool in self.mesh.pools()]
        self.gradients: ProcessGroup | None = \
            gradients[self.mesh.pools().index(self.mesh.pool_ranks(me))] if self.member else None
        """The pool, for the gradient sync's bucket collectives only (the data-parallel dimension)."""
        self.tensor = mine([made(ranks) for ranks in self.mesh.tp_groups()]) if self.mesh.tp > 1 else None
        """This rank's TP group; None without tensor parallelism."""
        self.pool = mine([made(pool) for pool in self.mesh.pools()])
        """This rank's whole pool (the world without TP or PP), for exchanges and checks: a
        remap domain may span a pool of any size."""
        for pool in self.mesh.pools():
            degree = 2
            while degree <= self.world_size:
                for start in range(0, self.world_size - degree + 1, degree):
                    group = made(pool[start:start + degree]) if degree < self.world_size else self.pool
                    if self.member and self.rank in range(start, start + degree) and pool == self.mesh.pool_ranks(me):
                        self._groups[(start, degree)] = group
                    cp = 2
                    while cp < degree:
                        u = degree // cp
                        for first in range(start, start + u):
                            if (group := made(pool[first:start + degree:u])) is not None:
                                self._strided[(first, u, cp)] = group
                        cp *= 2
                degree *= 2

    @classmethod
    def of_strategy(cls, strategy: Strategy, cluster: Cluster) -> list[ProcessGroups]:
        """Every pipeline's groups (each rank keeps its own pipeline's), made by every rank in the
        strategy's order."""
        return [cls(strategy.mesh(i, cluster), block=True) for i in range(len(strategy.pipelines))]

    def get(self, start: int, degree: int, cp: int = 1) -> ProcessGroup | ContextGroups | None:
        """The group of ranks start..start+degree-1; None for one rank (it needs no communication).
        Split u x cp (cp > 1): this rank's Ulysses sub-group and CP group in it."""
        if cp > 1:
            u, index = degree // cp, self.rank - start
            assert 0 <= index < degree and degree % cp == 0, (self.rank, start, degree, cp)
            block = self.get(start, degree)  # the block's own check, for a bad (start, degree)
            context = block if u == 1 else self._strided[(start + index % u, u, cp)]
            return ContextGroups(self.get(start + index // u * u, u), context, cp, block)
        if degree == 1 and 0 <= start < self.world_size:
            return None
        if (start, degree) == (0, self.world_size):
            return self.pool
        group = self._groups.get((start, degree))
        if group is None:
            raise ValueError(f"no process group for ranks {start}..{start + degree - 1}: a group must be "
                             f"an aligned power-of-two block inside the world of {self.world_size} ranks")
        return group

    def __len__(self) -> int:
        return len(self._groups) + len(self._strided)
