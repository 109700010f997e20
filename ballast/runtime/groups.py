"""Process groups for every aligned power-of-two block of ranks and every (u, c) split of it,
created once at start-up.

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

`gradients` is one more group of the whole world, for the gradient buckets alone
(`grad_sync.py`): their collectives are issued from backward hooks, at times that differ from
rank to rank, so they must not share a communicator with any exchange (a group spanning the
world is `WORLD`) or barrier, whose order the plan fixes.

Pools (pipeline parallelism, `pipeline/`): a plan lays out a pool of ranks, and a job of several
pools (one per pipeline stage) runs every plan on each. `ProcessGroups(pools)` then makes every
block and split inside every pool (their ranks the pool's, in its order), and `get` takes a
block's pool-relative start: this rank's own pool's group. `rank` is the rank's index in its
pool, what the plan's groups count; `gradients` and `pool_group` span its pool (the ranks that
hold the same parameters).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch.distributed as dist
from torch.distributed import ProcessGroup

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
    """Cache of the process groups of all aligned power-of-two blocks of the default world, or of
    every pool of `pools` (each a list of global ranks; together the world, in one order on every
    rank)."""

    def __init__(self, pools: Sequence[Sequence[int]] | None = None) -> None:
        timeout = world_timeout()
        if not dist.is_initialized() or timeout is None:
            raise ValueError("ProcessGroups needs torch.distributed to be initialised first, by "
                             "ballast.runtime.init_distributed or run_local (they record its timeout)")
        world = dist.get_world_size()
        pools = [list(pool) for pool in pools] if pools is not None else [list(range(world))]
        assert sorted(r for pool in pools for r in pool) == list(range(world)), "pools must cover the world once"
        assert len({len(pool) for pool in pools}) == 1, "every pool runs the same plans: one size"
        self.pool = next(pool for pool in pools if dist.get_rank() in pool)
        """This rank's pool: the global ranks the plans' ranks 0, 1, ... are."""
        self.world_size = len(self.pool)
        self.rank = self.pool.index(dist.get_rank())
        self._groups: dict[tuple[int, int], ProcessGroup] = {}
        self._strided: dict[tuple[int, int, int], ProcessGroup] = {}
        """(first rank, stride u, c) -> the CP group of those c ranks (pool-relative)."""
        gradients = [self._new(pool, range(len(pool)), timeout) for pool in pools]
        self.gradients: ProcessGroup = gradients[pools.index(self.pool)]
        """This rank's pool, for the gradient sync's bucket collectives only."""
        self.pool_group: ProcessGroup = (dist.group.WORLD if len(pools) == 1 else
                                         [self._new(pool, range(len(pool)), timeout) for pool in pools]
                                         [pools.index(self.pool)])
        """This rank's pool, for the collectives outside a step's passes (ZeRO-1's parameter
        broadcasts, checks): the world when the pool is."""
        for pool in pools:
            self._make_blocks(pool, timeout)

    def _new(self, pool: list[int], members: Sequence[int], timeout) -> ProcessGroup:
        """A new group of the pool's ranks `members` (pool-relative): a world collective, made
        by every rank in the same order."""
        return dist.new_group([pool[i] for i in members], timeout=timeout)

    def _make_blocks(self, pool: list[int], timeout) -> None:
        """Every aligned block of `pool` and its strided CP groups; kept where the pool is this
        rank's."""
        size, mine = len(pool), pool == self.pool
        whole = len(pool) == dist.get_world_size()
        degree = 2
        while degree <= size:
            # Same loops, same order on every rank: new_group's collective contract.
            for start in range(0, size - degree + 1, degree):
                block = (dist.group.WORLD if degree == size and whole
                         else self._new(pool, range(start, start + degree), timeout))
                if mine:
                    self._groups[(start, degree)] = block
                cp = 2
                while cp < degree:
                    u = degree // cp
                    for first in range(start, start + u):
                        group = self._new(pool, range(first, start + degree, u), timeout)
                        if mine:
                            self._strided[(first, u, cp)] = group
                    cp *= 2
            degree *= 2

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
        if (start, degree) == (0, self.world_size) and self.world_size == dist.get_world_size():
            return dist.group.WORLD  # a remap domain may span a world of any size
        group = self._groups.get((start, degree))
        if group is None:
            raise ValueError(f"no process group for ranks {start}..{start + degree - 1}: a group must be "
                             f"an aligned power-of-two block inside the {self.world_size} ranks of a plan")
        return group

    def __len__(self) -> int:
        return len(self._groups) + len(self._strided)
