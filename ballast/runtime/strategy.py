"""Runs a step under a heterogeneous strategy (`plans/strategy_plan.py`): this rank's pipeline runs
its part of the plan with a model of its own (t, p), whose parameters come from the canonical
layout every rank shares and whose gradients go back into it (`canonical.py`).

    step:  the strategy's checks (every rank, before any collective)
           -> this rank's pipeline executor (its model built, cut and split for its (t, p), its
              process groups made once per strategy by every rank in the strategy's order)
           -> gather the compute parameters from the canonical shards (the world)
           -> the part's passes on the pipeline (`Executor.passes`, its own groups only)
           -> the pool's gradient sync, then the reduction into the shards (the world)
           -> loss, per-sample flags and the gradient's squares in one all-reduce (the world)
           -> AdamW on the shards

A rank keeps the executor of the strategy it last ran (a step of another strategy builds its
model anew: a device holds one compute model at a time) and the process groups of every strategy
it ran (made once: `dist.new_group` is a rendezvous of the whole world).

The device never holds the whole model: the model of record is built once on the host (a
host's ranks in turns, `build_turns.py`), where its units are flattened and cut into the
canonical shards that go to the device; a compute
model is built without weights (on the meta device), cut to its stage and TP shard, and only
then given storage on the device, which the gather fills, its untrained tensors (buffers such
as RoPE's frequencies, frozen parameters) copied from the host's.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..models.protocol import ParallelModel, PartLoad
from ..plans.strategy_plan import StrategyPlan
from ..vocabulary.cluster import Cluster
from ..vocabulary.precision import Precision
from ..vocabulary.strategy import Strategy
from ..pricing.parameter_movement import Movement
from .canonical import CanonicalState, WorldHoldings
from .executor import Executor
from .step_result import StepResult, device_clock, step_if_finite
from .groups import ProcessGroups
from .build_turns import in_turns
from .parallelize import parallelize
from .placement import held_block
from .tensor_parallel.apply import split_dims_of
from .world import rank_device


class StrategyExecutor:
    """Runs `StrategyPlan`s on this rank: `executor.step(plan, samples)` (module docstring)."""

    def __init__(self, build: Callable[..., ParallelModel], cluster: Cluster, *,
                 precision: Precision = Precision.AUTO, movement: Movement = Movement.SLICED,
                 part: PartLoad | None = None, **adamw: float):
        """`build()` makes the whole model on the host, alike on every rank, and
        `build(weights=False)` its structure on the meta device (`models.build_model`'s); a
        collective: every rank of the job calls it. `movement`: how parameters and gradients move
        between the canonical layout and each step's pipelines (`canonical.py`); `part`: where
        the model's weights can be read a tensor at a time (`models.part_load`), the model of
        record is read so instead of built; `adamw` are AdamW's keyword arguments."""
        cluster.check_world_size(dist.get_world_size())
        self.build, self.cluster, self.precision, self.adamw = build, cluster, precision, adamw
        self.movement, self.part = movement, part
        self.device = rank_device()
        self.shape = build(weights=False).shape
        # The model of record whole on the host, a host's ranks in turns (`build_turns.py`), each
        # cutting its canonical shards before the next turn builds: every rank builds it alike
        # (one seed or folder), so the shards of every rank are of one model. Read a unit at a
        # time, it needs no turns.
        record = self._record() if part is not None else in_turns(self.shape, self._record)
        self.untrained, self.persistent, self.canonical = record
        self.optimizer = torch.optim.AdamW(self.canonical.shards, **adamw)
        self._groups: dict[Strategy, list[ProcessGroups]] = {}
        self._running: tuple[Strategy, int, Executor, WorldHoldings | None] | None = None

    def _record(self) -> tuple[dict[str, Tensor], set[str], CanonicalState]:
        """The model of record built on the host (or its skeleton, its tensors read as the shards
        are cut): its untrained tensors (buffers, frozen ones), the names of those its state dict
        holds (not a non-persistent buffer) and this rank's canonical shards of the rest; the
        host's copy goes with this frame."""
        model = self.build() if self.part is None else self.part.skeleton()
        read = self.part.read if self.part is not None else None
        # A skeleton's buffers are made; its frozen parameters are read.
        untrained = {name: (read(name) if tensor.is_meta else tensor.detach().clone())
                     for name, tensor in untrained_tensors(model)}
        persistent = set(model.state_dict()) & set(untrained)
        return untrained, persistent, CanonicalState(model, list(model.blocks()), split_dims_of(model),
                                                     self.cluster.devices_per_node, self.device, read)

    def executor(self, strategy: Strategy) -> tuple[int, Executor, WorldHoldings | None]:
        """This rank's pipeline of `strategy`, its executor and, for the sliced movement, what every
        rank holds (collectives when the strategy changes: every rank makes every pipeline's groups
        the first time, and tells what its compute model holds)."""
        if self._running is not None and self._running[0] == strategy:
            return self._running[1:]
        if strategy not in self._groups:
            self._groups[strategy] = ProcessGroups.of_strategy(strategy, self.cluster)
        index = strategy.pipeline_of(dist.get_rank())
        self._running = None  # the last strategy's model goes before this one's is built
        executor = parallelize(self.build(weights=False), strategy.block_cluster(index, self.cluster),
                               mesh=strategy.mesh(index, self.cluster), groups=self._groups[strategy][index],
                               precision=self.precision, broadcast=False, **self.adamw)
        with torch.no_grad():
            for name, tensor in untrained_tensors(executor.model):
                block = held_block(name, tensor, executor.tensor_parallel)  # a frozen split weight: its TP shard
                tensor.copy_(self.untrained[name] if block is None else self.untrained[name][block])
        exchange = None
        if self.movement is Movement.SLICED:
            here = executor.mesh.coordinate(dist.get_rank())
            exchange = WorldHoldings.gather(self.canonical.holding(executor.model, executor.mesh.tp, here.tp_index,
                                                              lays=here.pool_index == 0, pipeline=index))
        self._running = (strategy, index, executor, exchange)
        return index, executor, exchange

    def step(self, plan: StrategyPlan, samples: Sequence[Any]) -> StepResult:
        """One optimizer step of `plan`; samples[j] is the batch's sample j as the model takes it.
        Every rank passes the same plan and samples; a plan whose strategy does not cover the
        cluster raises ValueError on every rank before any collective."""
        self._check(plan, samples)
        index, executor, exchange = self.executor(plan.strategy)
        ids, part = plan.ids[index], plan.parts[index]
        tp, here = executor.mesh.tp, executor.mesh.coordinate(dist.get_rank())
        start = device_clock(self.device)
        self.canonical.gather_into(executor.model, tp, here.tp_index, exchange)
        gathered = device_clock(self.device) - start
        result, loss = executor.passes(part, [samples[j] for j in ids])
        start = device_clock(self.device)
        executor.finish_gradients()
        self.canonical.reduce_from(executor.model, tp, here.tp_index, here.pool_index == 0, exchange)
        flags = torch.zeros(len(plan.lengths), device=loss.device)
        if here.tp_index > 0:  # a TP group's ranks hold the same loss and flags: its first counts them
            loss = torch.zeros_like(loss)
        elif ids:
            flags[torch.tensor(ids, dtype=torch.long, device=loss.device)] = executor.nonfinite_flags(len(ids))
        stats = torch.cat([loss.reshape(1), flags, self.canonical.squares().reshape(1)])
        dist.all_reduce(stats)
        result.loss, result.grad_norm = float(stats[0]), math.sqrt(float(stats[-1]))
        result.nonfinite_samples = torch.nonzero(stats[1:-1]).flatten().tolist()
        result.tokens = plan.tokens
        result.sync_seconds = gathered + device_clock(self.device) - start
        return step_if_finite(result, self.optimizer, self.device)

    def _check(self, plan: StrategyPlan, samples: Sequence[Any]) -> None:
        """What every rank can check of the whole plan before any collective (a part's own
        executor checks its samples' shapes against the model as any plan's)."""
        plan.validate(self.cluster)
        if len(samples) != len(plan.lengths):
            raise ValueError(f"the plan has {len(plan.lengths)} samples but {len(samples)} were given")
        for i, part in enumerate(plan.parts):
            mesh = plan.strategy.mesh(i, self.cluster)
            for _, group, mb in part.micro_batches():
                if mb.seq_ids and (why := mesh.split_why_not(self.shape, group.degree, group.cp)):
                    raise ValueError(f"{plan.where(i)}: model {self.shape.name!r}: {why}")

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """This rank's canonical shards and their AdamW state, by name: what a checkpoint saves and
        loads in place (`train/checkpoint.py`; the same world size cuts the same shards)."""
        state = {}
        for u, shard in enumerate(self.canonical.shards):
            adam = self.optimizer.state[shard]
            if not adam:  # no step applied yet: AdamW's own fresh state, which loading then fills
                adam.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(shard), exp_avg_sq=torch.zeros_like(shard))
            state[f"shard{u}"] = shard.detach()
            state.update({f"{name}{u}": value for name, value in adam.items()})
        return state

    def state_on_host(self) -> dict[str, torch.Tensor]:
        """The model's state dict whole, by name, on rank 0's host ({} elsewhere; a collective, a
        unit at a time: what writing the trained model out takes): every trained parameter, then
        the persistent untrained tensors of the model of record, which no step changes."""
        state = self.canonical.parameters_on_host(0)
        if dist.get_rank() == 0:
            state.update((name, self.untrained[name]) for name in self.untrained if name in self.persistent)
        return state

    def parameters(self) -> list[torch.Tensor]:
        """Every trained parameter whole, in the model's order (a collective, for checks)."""
        return self.canonical.whole_parameters()

    def gradients(self) -> list[torch.Tensor]:
        """The last step's summed gradients whole, in the model's order (a collective)."""
        return self.canonical.whole_gradients()


def untrained_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """`model`'s tensors that no gradient moves, by name: its buffers and frozen parameters."""
    frozen = [(name, p) for name, p in model.named_parameters() if not p.requires_grad]
    return list(model.named_buffers()) + frozen
