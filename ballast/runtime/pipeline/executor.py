"""Run a step's plan through a pipeline: every stage's pool runs the plan's micro-batches in
1F1B order (`vocabulary/pipeline_schedule.py`), activations and their gradients passed between
neighbouring stages (`p2p.py`).

The schedule's micro-batches are the plan's slots: wave by wave, every group's first
micro-batch, then every group's second, ... up to the wave's longest group (a rank whose group
has run out has an empty slot, which runs nothing). Every rank of a pool thus walks the same
slots in the same 1F1B order, whatever its group, so the collectives inside a slot (Ulysses'
all-to-alls, CP's gathers) meet: all ranks of a stage run pass j of the schedule as their j-th,
like one rank of a plain pipeline, and the pipeline's send-after-compute, receive-before-compute
dataflow cannot deadlock. Waves are not barriers here: a wave's slots follow the previous wave's
in the one schedule (as Megatron-LM's dynamic CP runs bins of different CP sizes through one
pipeline), so micro-batches of different layouts are in flight at once.

A slot's micro-batch has the same group, split and shard at every stage: stage k's rank of pool
rank r receives exactly the rows its predecessor of pool rank r sends, and both know how many
from the plan. Each stage recomputes `ceil(recompute * its blocks)` of its own blocks for a
micro-batch at level `recompute`. The last stage scores its rows (loss / Plan.tokens, as the
executor's) and starts backward; the others backpropagate the gradient of the rows they sent.

Under tensor parallelism each stage's layers are split over its TP groups (`tensor_parallel/`),
and a rank's pipeline is the ranks of its pool index and TP index, one per stage
(`JobMesh.pp_ranks`): TP rank j of stage k sends to TP rank j of stage k + 1. Between the split
regions the residual stream is whole and equal on every rank of a TP group (no sequence-parallel
activations), so each TP rank sends its own copy: t parallel transfers, one per device and link,
taking as long as one, where sending from one rank and broadcasting inside the next stage's TP
group would serialise the transfer behind one link and add a collective per micro-batch. The
gradient coming back is equal across the TP group too (the first split layer's f all-reduces it).

Why the gradient is the single-process one: per micro-batch the stages compose the model's
forward on each rank's rows (what a stage receives is what the previous one computed for the
same rows), the received tensor is a leaf whose gradient is sent back, so backward composes the
chain rule stage by stage; within a stage everything is the executor's (`executor.py`), with
the stage's parameters summed over its pool by the gradient sync on the pool's group. Every
parameter lives on one stage, so each stage's sum is its parameters' whole gradient.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from ...models.protocol import ParallelModel, StagedModel, held_tokens
from ...plans.plan import Group, MicroBatch, Plan
from ...vocabulary.cluster import Cluster
from ...vocabulary.job_mesh import JobMesh
from ...vocabulary.pipeline_schedule import one_f_one_b, recomputed_blocks
from ...vocabulary.precision import Precision
from ..attention import StreamShard
from ..executor import Executor
from ..step_result import MicroBatchRecord, StepResult, WaveTiming
from ..grad_sync import GradSync
from ..groups import ProcessGroups
from ..memory import ActivationMeter
from ..routing import RoutingGroups
from ..tensor_parallel import TensorParallel
from .p2p import Receive, Send, StageLinks


@dataclass(frozen=True)
class PipelineSlot:
    """One micro-batch of the step's pipeline schedule, as this rank sees it."""

    wave: int
    group: Group
    """This rank's group in the wave."""
    micro_batch: MicroBatch
    """Its micro-batch of this slot (empty past its last)."""


def pipeline_slots(plan: Plan, rank: int) -> list[PipelineSlot]:
    """The step's slots (`Plan.slots`) for pool rank `rank`: as many for every rank of the pool."""
    return [PipelineSlot(w, group, mb) for w, _, parts in plan.slots() for group, mb in parts if rank in group.ranks]


@dataclass
class InFlight:
    """A micro-batch between its forward and its backward on this stage."""

    slot: PipelineSlot
    received: Tensor | None
    """The rows received from the previous stage (a leaf that requires grad); None on the first."""
    output: Tensor
    """The rows sent on, or on the last stage the loss share."""
    rows: int
    recompute_layers: int
    seconds: float
    activation_bytes: int | None


class PipelineExecutor(Executor):
    """Runs plans on this rank's stage of a pipeline (`parallelize` under a mesh of PP degree > 1)."""

    def __init__(self, model: ParallelModel, optimizer: torch.optim.Optimizer, cluster: Cluster, mesh: JobMesh,
                 groups: ProcessGroups, routing: RoutingGroups | None = None, *, sync: GradSync,
                 tensor_parallel: TensorParallel | None = None, measure_activations: bool = False,
                 precision: Precision = Precision.AUTO):
        assert isinstance(model, StagedModel) and mesh.pp > 1 and routing is None, "parallelize checks these"
        super().__init__(model, optimizer, cluster, mesh, groups, routing, sync=sync, tensor_parallel=tensor_parallel,
                         measure_activations=measure_activations, precision=precision)
        here = mesh.coordinate(dist.get_rank())
        self.stage = here.stage
        self.first, self.last = self.stage == 0, self.stage == mesh.pp - 1
        dtype = next(model.parameters()).dtype
        self.links = StageLinks(model.shape.hidden, dtype, self.device)
        # This rank's pipeline: its pool index and TP index at every stage (`JobMesh.pp_ranks`).
        # Under TP every rank of a TP group holds the whole residual stream (no sequence-parallel
        # activations), so each sends its own copy to the same TP index of the next stage.
        pipeline = mesh.pp_ranks(dist.get_rank())
        self._previous = None if self.first else pipeline[self.stage - 1]
        self._next = None if self.last else pipeline[self.stage + 1]

    def _check(self, plan: Plan, samples: Sequence[Any]) -> None:
        super()._check(plan, samples)
        if any(wave.remap for wave in plan.waves):
            raise ValueError(f"plan {plan.planner!r} has remap domains, which a pipeline stage does not run: plan "
                             f"without remapping under --pp")

    def _backward_passes(self, plan: Plan) -> int:
        return sum(1 for slot in pipeline_slots(plan, self.rank) if sum(plan.mb_lengths(slot.micro_batch)))

    def _run_plan(self, plan: Plan, samples: Sequence[Any], result: StepResult) -> Tensor:
        """The step's slots in this stage's 1F1B order; one `WaveTiming` for the whole schedule
        (busy: the passes, their collectives included; wait: waiting for the neighbours)."""
        slots = pipeline_slots(plan, self.rank)
        loss = torch.zeros((), dtype=torch.float32, device=self.device)
        flight: dict[int, InFlight] = {}
        pending: Send | None = None
        began, waited = self._clock(), 0.0
        for p in one_f_one_b(self.stage, self.mesh.pp, len(slots)):
            slot = slots[p.micro_batch]
            runs = sum(plan.mb_lengths(slot.micro_batch)) > 0
            shard = self._shard(plan, slot.wave, slot.group, slot.micro_batch) if runs and p.forward else None
            rows = (held_tokens(shard.local, shard.bounds[-1]) if p.forward else flight[p.micro_batch].rows) \
                if runs else 0
            peer = self._previous if p.forward else self._next
            start = self._clock()
            got = self.links.exchange(pending, Receive(peer, rows) if peer is not None and rows else None)
            waited += self._clock() - start
            pending = None
            if not runs:
                continue
            if p.forward:
                flight[p.micro_batch] = done = self._forward(plan, slot, shard, got, rows, samples)
                if self.last:
                    loss += done.output.detach()
                elif rows:
                    pending = Send(self._next, done.output.detach())
            else:
                done = flight.pop(p.micro_batch)
                self._backward(done, got, result)
                if not self.first and done.rows:
                    pending = Send(self._previous, done.received.grad)
        start = self._clock()
        self.links.exchange(pending, None)
        self.links.finish()
        waited += self._clock() - start
        assert not flight, "a micro-batch's backward did not run"
        result.waves.append(WaveTiming(self._clock() - began - waited, waited))
        return loss

    def _forward(self, plan: Plan, slot: PipelineSlot, shard: StreamShard, received: Tensor | None, rows: int,
                 samples: Sequence[Any]) -> InFlight:
        """The stage's forward of the slot's micro-batch on this rank's rows."""
        start = self._clock()
        if not self.first:
            received = (received if rows else torch.zeros(0, self.model.shape.hidden, dtype=self.links.dtype,
                                                          device=self.device)).requires_grad_()
        mb = slot.micro_batch
        # Exact for the levels of a pipeline's cost model (`CostModel.level_blocks`).
        recompute_layers = recomputed_blocks(mb.recompute, len(self.model.blocks()))
        meter = ActivationMeter() if self.measure_activations else None
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)
        with meter or contextlib.nullcontext(), autocast:
            out = self.model.stage_forward(received, [samples[i] for i in mb.seq_ids], shard, shard.local,
                                           recompute_layers)
            if self.last:  # the model's loss is summed over its tokens: the normaliser is the whole batch's
                out = out / plan.tokens
        return InFlight(slot, received, out, rows, recompute_layers, self._clock() - start,
                        meter.bytes if meter else None)

    def _backward(self, done: InFlight, grad: Tensor | None, result: StepResult) -> None:
        """The stage's backward of a micro-batch: from its loss share on the last stage, else from
        the gradient of the rows it sent (zero rows: nothing was received); every rank of the
        group runs it, an empty shard too (its collectives are awaited)."""
        start = self._clock()
        self._before_backward()
        if self.last:
            done.output.backward()
            self._shares.append((done.slot.micro_batch.seq_ids, done.output.detach()))
        else:
            done.output.backward(grad if grad is not None else torch.zeros_like(done.output))
        slot = done.slot
        result.micro_batches.append(MicroBatchRecord(
            slot.wave, slot.group.degree, list(slot.micro_batch.seq_ids), done.rows, done.recompute_layers,
            done.seconds + self._clock() - start, done.activation_bytes))

    def gradients(self) -> list[Tensor]:
        """The whole model's summed gradients, every stage's, on every rank (a collective, for checks)."""
        return self._every_stage(super().gradients())

    def parameters(self) -> list[Tensor]:
        """The whole model's parameters, every stage's, whole, on every rank (a collective)."""
        return self._every_stage(super().parameters())

    def state_on_host(self, rank: int = 0) -> dict[str, Tensor]:
        """Every stage's part of the model's state dict (`WholeState.tensors`) whole on global
        rank `rank`'s host, by name in the model's order, {} on the other ranks (a collective):
        stage by stage, a tensor at a time, each made whole on its stage (FSDP2's, TP's shards) and
        sent by the stage's first rank; so a device holds its stage and one tensor whole at most."""
        here, out = dist.get_rank() == rank, {}
        for stage in range(self.mesh.pp):
            source = self.mesh.rank(stage, 0, 0)
            mine = stage == self.stage
            held = self.whole.tensors() if mine else []
            listed = [[(n, self.whole.shape(n, t), t.dtype) for n, t in held] if mine else None]
            dist.broadcast_object_list(listed, src=source, group=self.groups.job)
            for (name, shape, dtype), (_, t) in zip(listed[0], held if mine else [(None, None)] * len(listed[0])):
                whole = self.whole.tensor(name, t) if mine else None
                if here and source != rank:
                    whole = torch.empty(shape, dtype=dtype, device=self.device)
                    dist.recv(whole, src=source, group=self.groups.job)
                elif dist.get_rank() == source and source != rank:
                    dist.send(whole.contiguous(), dst=rank, group=self.groups.job)
                if here:
                    out[name] = whole.cpu()
        return out

    def _every_stage(self, tensors: list[Tensor]) -> list[Tensor]:
        """Every stage's `tensors` (its parameters' or their gradients, whole over its TP group, in
        model order), stage by stage, on every rank: the model's order, since stages hold
        consecutive blocks with the embedding first and the output layer last. Each stage's
        first rank broadcasts its own."""
        out: list[Tensor] = []
        for stage in range(self.mesh.pp):
            source = self.mesh.rank(stage, 0, 0)
            mine = stage == self.stage
            shapes = [[tuple(t.shape) for t in tensors] if mine else None]
            dist.broadcast_object_list(shapes, src=source, group=self.groups.job)
            sizes = [int(torch.Size(s).numel()) for s in shapes[0]]
            flat = (torch.cat([t.reshape(-1) for t in tensors]) if mine
                    else torch.empty(sum(sizes), dtype=self.links.dtype, device=self.device))
            dist.broadcast(flat, src=source, group=self.groups.job)
            out += [piece.view(s) for piece, s in zip(torch.split(flat, sizes), shapes[0])]
        return out
