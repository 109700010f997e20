"""Run a `ballast.plans.plan.Plan` for one optimizer step on every rank with torch.distributed.

Every rank runs the same plan, rank 0's (`broadcast.py`), on a model `parallelize` prepared.

One step (`Executor.step`):
  - for every wave, this rank's group (`Plan.group_of`) runs its micro-batches one after
    another; in a remap domain of the wave (`Wave.remap`) all the domain's groups run theirs
    slot by slot together, linear work balanced over the domain (`remap.py`). A micro-batch's
    packed stream is split contiguously over the group's ranks (`StreamShard`; for a
    spatial-temporal video model, `video_sp.VideoShard`: whole frames when they balance, which
    the model's `arrange` switches to whole patch columns for temporal blocks; for a group
    with a CP part, `hybrid.HybridShard`: head-tail chunks, `local` their stream indices); each rank
    runs forward and backward on its shard, with the plan's recompute level (the first
    round(recompute * layers) blocks are recomputed), and its loss is the model's summed
    per-token loss of its shard (`ParallelModel.loss`) divided by `Plan.tokens`;
  - in a routed wave (`Wave.routed`) the exchanges over two or more nodes (a remap slot's route,
    Ulysses' head exchange, a video layout switch) go over every NIC of the node
    (`routing.RoutedExchange`, with the routing groups `parallelize` made): the same rows
    move, so the step is bit for bit the unrouted one;
  - a wave ends with a barrier of the world (the plan's semantics: the next wave may regroup
    ranks), which also measures how long this rank waited for the wave's slowest group;
  - gradients accumulate locally; during the rank's last backward of the step they are summed
    over the world in buckets, overlapped with the rest of that backward (`grad_sync.py`: an
    all-reduce per bucket, a reduce-scatter to the optimizer shards' owners under ZeRO-1);
    after the last wave the rank waits for its buckets, all-reduces the loss and per-sample
    flags of non-finite losses, and steps AdamW, skipped on every rank alike when the loss or
    gradient norm is not finite (`StepResult.applied`).

Why a plain SUM over the world is the full-batch gradient, whatever the plan (remapped, idle
and empty-shard ranks included): docs/design.md, section 7, *Why the sum is the single-process
gradient*.

Under tensor parallelism (a `JobMesh` with TP degree t, `parallelize(mesh=)`) the plan's ranks
are the pool's: every rank of a TP group runs its pool rank's part of the plan on the same tokens,
over its own TP index's copy of the pool's groups (`ProcessGroups`), each rank with its shard of
the split layers (`tensor_parallel/`). The sum above is then over the pool of the rank's TP
index; a TP group's ranks hold the same loss, so only the first adds it (`_synchronise`).
Under pipeline parallelism (`pipeline/executor.py`, `PipelineExecutor`) each rank holds its
stage's layers and runs the plan's micro-batches through the stages in 1F1B order; the sum is
the same, each stage's over its own pool.

Precision (`Precision`): by default on a GPU the forward runs under bf16 autocast (matmuls,
attention and the all-to-alls in bf16: every attention casts q, k and v to the autocast dtype,
`kernels.in_autocast_dtype`, so a varlen kernel can serve it; parameters, gradients and AdamW
stay fp32), as the cost model's GPU presets assume (`Cluster.value_bytes` = 2); on a CPU
everything is fp32 (the `cpu` preset's 4 bytes). `Precision.BF16` autocasts on a CPU too: the
tests and `verify --precision bf16` run the bf16 dtypes, exchanges and tolerances that way, not
the GPU's kernels (flash-attn, PyTorch's CUDA varlen), NCCL or CUDA placement.

Empty micro-batches (`seq_ids == []`, the padding of lockstep plans) run nothing with
replicated parameters: no collective needs them. A model sharded with FSDP2 (`fsdp.py`) runs
lockstep plans only, every empty micro-batch as a pass on a dummy token (its rank must join
the parameter all-gathers), and every backward reduce-scatters the gradients, which accumulate
sharded, instead of the bucketed sync: the same sum over ranks, each rank keeping its shard.
"""
from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from ..vocabulary.cluster import Cluster
from ..vocabulary.job_mesh import JobMesh
from ..vocabulary.layouts import CONTEXT, ULYSSES, VIDEO_2D, Layout
from ..vocabulary.precision import Precision
from ..models.protocol import Local, PackedStream, ParallelModel, held_tokens
from ..plans.plan import Group, MicroBatch, Plan
from .attention import StreamShard
from .fsdp import is_sharded
from .grad_sync import GradSync
from .groups import ProcessGroups
from .hybrid import HybridShard
from .memory import ActivationMeter
from .plan_check import check_plan
from .remap_slot import remapped_stream, slot_parts, slot_runs
from .routing import RoutingGroups
from .step_result import (MicroBatchRecord, StepResult, WaveTiming, device_clock, nonfinite_flags,
                          step_if_finite, world_statistics)
from .tensor_parallel import TensorParallel
from .video_sp import VideoShard
from .whole_state import WholeState


SHARDS: dict[Layout, type[StreamShard]] = {ULYSSES: StreamShard, VIDEO_2D: VideoShard, CONTEXT: HybridShard}
"""How a group's ranks hold a micro-batch in each layout (`layouts.py`; a group of one rank
holds its stream whole, a `StreamShard` of degree 1; a group with a CP part, `Group.cp` > 1,
runs its layout's `with_context`: CONTEXT, Ulysses over `Group.ulysses` ranks inside it, or
VIDEO_2D, whose fallback then runs so)."""


class Executor:
    """Runs plans on this rank: `executor.step(plan, samples)`. Made by `parallelize`, which
    installs the sequence-parallel attention and starts every rank from the same weights."""

    def __init__(self, model: ParallelModel, optimizer: torch.optim.Optimizer, cluster: Cluster, mesh: JobMesh,
                 groups: ProcessGroups, routing: RoutingGroups | None = None, *, sync: GradSync | None = None,
                 tensor_parallel: TensorParallel | None = None, measure_activations: bool = False,
                 precision: Precision = Precision.AUTO):
        assert isinstance(precision, Precision), precision
        assert (mesh.tp, mesh.pp) == (groups.mesh.tp, groups.mesh.pp), "the groups are the mesh's"
        self.mesh = mesh
        """The job's TP degree, PP degree and pool: plans name the pool's ranks."""
        assert routing is not None or cluster.nodes == 1 or self.mesh.tp * self.mesh.pp > 1 \
            or self.mesh.ranks != range(dist.get_world_size()), "parallelize makes the routing groups of 2+ nodes"
        assert (tensor_parallel is None) == (self.mesh.tp == 1), "TP splits the model when the mesh has a TP degree"
        self.fsdp = is_sharded(model)
        assert (sync is None) == self.fsdp, "replicated weights need the gradient sync, FSDP2 has its own"
        self.sync = sync
        self.tensor_parallel = tensor_parallel
        self.model = model
        self.optimizer = optimizer
        self.cluster = cluster
        self.pool_cluster = self.mesh.pool_cluster(cluster)
        """The cluster the plans are made for: the pool's ranks (`JobMesh.pool_cluster`)."""
        self.groups = groups
        self.routing = routing
        """The node and rail groups of a cluster of two or more nodes, made at start-up: a
        routed wave's inter-node exchanges run over them (`_routing`)."""
        self.rank = groups.rank
        """This rank's pool rank: the rank of the plans' groups."""
        self.tp_index = self.mesh.coordinate(dist.get_rank()).tp_index
        self.measure_activations = measure_activations
        self.device = next(model.parameters()).device
        self.bf16 = precision.autocast(self.device.type)
        trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.parameter_names = [n for n, _ in trained]
        """The trained parameters' names (`parameters` and `gradients` in this order), by which TP
        knows its split ones (FSDP2 replaces the objects)."""
        self._params = [p for _, p in trained]
        self.whole = WholeState(model, self.parameter_names, self._params, sync, groups.pool, tensor_parallel)
        """This rank's state made whole, for checks and for writing the model out."""
        # The running step's (seq_ids, loss share) of every micro-batch this rank ran: checked for
        # finiteness once, at the end, not per micro-batch (each check would wait for the device).
        self._shares: list[tuple[list[int], Tensor]] = []
        self._passes_left = 0
        """Backward passes this rank has still to run in the step: the sync arms before the last."""

    def step(self, plan: Plan, samples: Sequence[Any]) -> StepResult:
        """One optimizer step of `plan`; samples[i] is sample i as the model takes it (a text
        sequence's lengths[i] + 1 token ids, a clip), of the shape the plan has for it.

        Every rank must pass the same plan and samples (see `broadcast.broadcast_plan`). Invalid input
        raises ValueError (PlanError) on every rank before any collective.
        """
        result, loss = self.passes(plan, samples)
        start = self._clock()
        result.loss, result.grad_norm, nonfinite = self._synchronise(loss, self.nonfinite_flags(len(plan.lengths)))
        result.nonfinite_samples = torch.nonzero(nonfinite).flatten().tolist()
        result.sync_seconds = self._clock() - start
        return step_if_finite(result, self.optimizer, self.device)

    def passes(self, plan: Plan, samples: Sequence[Any]) -> tuple[StepResult, Tensor]:
        """`step`'s forward and backward passes alone (a strategy's step runs them, then reduces
        into its canonical layout: `runtime/strategy.py`): the result so far, with its waves'
        and micro-batches' records, and this rank's summed loss shares. The gradients are this
        rank's until `finish_gradients`."""
        self._check(plan, samples)
        self.model.train()
        if self.sync is None:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.sync.start()
        self._shares = []
        self._passes_left = self._backward_passes(plan)
        result = StepResult(loss=0.0, tokens=plan.tokens, waves=[])
        return result, self._run_plan(plan, samples, result)

    def finish_gradients(self) -> None:
        """Wait for the gradient sync over the pool: then every pool rank holds the pool's summed
        gradients (replicated weights), or its share of them."""
        assert self._passes_left == 0, "the step ran another number of backward passes than its plan"
        if self.sync is not None:
            self.sync.finish()

    def _run_plan(self, plan: Plan, samples: Sequence[Any], result: StepResult) -> Tensor:
        """The step's passes on this rank, wave by wave (timed into `result.waves`); returns the
        rank's summed loss shares."""
        loss = torch.zeros((), dtype=torch.float32, device=self.device)
        for w, wave in enumerate(plan.waves):
            group = plan.group_of(w, self.rank)
            domain = wave.domain_of(self.rank)
            start = self._clock()
            if domain is None:
                for mb in group.micro_batches:
                    loss += self._run(plan, w, group, mb, samples, result) if sum(plan.mb_lengths(mb)) \
                        else self._skip()
            else:
                for slot in range(max(len(g.micro_batches) for g in wave.domain_groups(*domain))):
                    loss += self._run_slot(plan, w, domain, slot, samples, result) \
                        if slot_runs(plan, w, domain, slot) else self._skip()
            busy = self._clock() - start
            dist.barrier(group=self.groups.job)
            result.waves.append(WaveTiming(busy, self._clock() - start - busy))
        return loss

    def gradients(self) -> list[Tensor]:
        """The last step's summed gradient of every trained parameter, whole, on every rank (a
        collective, for checks: `WholeState.gradients`)."""
        return self.whole.gradients()

    def parameters(self) -> list[Tensor]:
        """Every trained parameter, whole, on every rank (a collective, for checks and for
        writing the model out), in the order of `parameter_names`."""
        return self.whole.parameters()

    def state_on_host(self, rank: int = 0) -> dict[str, Tensor]:
        """The model's state dict whole on global rank `rank`'s host, by name, {} on the other
        ranks (a collective, a tensor at a time: `WholeState.on_host`)."""
        return self.whole.on_host(rank)

    def _backward_passes(self, plan: Plan) -> int:
        """How many backward passes this rank runs in `plan`: its groups' micro-batches and its
        remap domains' slots that hold tokens (what `step` runs rather than skips)."""
        count = 0
        for w, wave in enumerate(plan.waves):
            domain = wave.domain_of(self.rank)
            if domain is None:
                count += sum(1 for mb in plan.group_of(w, self.rank).micro_batches if sum(plan.mb_lengths(mb)))
            else:
                slots = max(len(g.micro_batches) for g in wave.domain_groups(*domain))
                count += sum(1 for slot in range(slots) if slot_runs(plan, w, domain, slot))
        return count

    def _clock(self) -> float:
        return device_clock(self.device)

    def _check(self, plan: Plan, samples: Sequence[Any]) -> None:
        check_plan(plan, samples, self.mesh, self.pool_cluster, self.model, routes=self.routing is not None,
                   lockstep_only=self.fsdp)

    def _run(self, plan: Plan, wave: int, group: Group, mb: MicroBatch, samples: Sequence[Any],
             result: StepResult) -> Tensor:
        # Under 2D sequence parallelism `local` is the initial layout's slice (whole frames, or
        # the even split when frames do not balance); with a CP part, the stream indices of the
        # rank's rows (its CP shard's head and tail chunks are not contiguous).
        start = self._clock()
        shard = self._shard(plan, wave, group, mb)
        return self._forward_backward(plan, mb.seq_ids, shard, shard.local, mb.recompute, samples, result,
                                      (wave, group, mb), start)

    def _shard(self, plan: Plan, wave: int, group: Group, mb: MicroBatch, layout: Layout | None = None
               ) -> StreamShard:
        """This rank's share of micro-batch `mb` of `group` in wave `wave`, in the group's layout
        (the model's, or `layout`), with its CP part."""
        layout = (layout or self.model.shape.pattern.layout).with_context(group.cp)
        holder = SHARDS[layout] if group.degree > 1 else StreamShard
        return holder.create(
            plan.mb_samples(mb), self.groups.get(group.start, group.degree, group.cp), group.degree,
            self.rank - group.start, self.device, routing=self._routing(plan, wave))

    def _run_slot(self, plan: Plan, wave: int, domain: tuple[int, int], slot: int,
                  samples: Sequence[Any], result: StepResult) -> Tensor:
        """Slot `slot` of a remap domain: every group's slot-th micro-batch, linear work balanced
        over the domain (`remap.py`). Every rank of the domain runs it, at the slot's lowest
        recompute level (a layer's recomputation repeats collectives: all must recompute alike).

        A video model's spatial and temporal blocks need no 2D layouts here: `RemappedStream`
        inherits `PackedStream.arrange`, which keeps the rows on the balanced layout (so the
        positions of `whole.positions[local]` stay right) and only sets the pattern, and
        `RemappedStream.attend` passes that pattern to the group's plain `StreamShard`, whose
        Ulysses attention holds the group's whole stream per head and takes the pattern's spans
        over it (`attention_spans`: frames, or patch columns gathered column by column)."""
        began = self._clock()
        parts = slot_parts(plan, wave, domain, slot)
        group, mb = next((g, mb) for g, mb in parts if self.rank in g.ranks)
        routing = self._routing(plan, wave)
        shard = self._shard(plan, wave, group, mb, ULYSSES) if sum(plan.mb_lengths(mb)) else None
        stream, local = remapped_stream(plan, parts, domain, self.rank, shard, self.groups, self.device, routing)
        seq_ids = [i for _, part in parts for i in part.seq_ids]
        recompute = min(part.recompute for _, part in parts if part.seq_ids)
        return self._forward_backward(plan, seq_ids, stream, local, recompute, samples, result,
                                      (wave, group, mb), began)

    def _routing(self, plan: Plan, wave: int) -> RoutingGroups | None:
        """The routing groups when `wave` routes its inter-node exchanges (`Wave.routed`, which
        `Plan.validate` refuses on one node), else None: every exchange as one all-to-all."""
        return self.routing if plan.waves[wave].routed else None

    def _forward_backward(self, plan: Plan, seq_ids: list[int], stream: PackedStream, local: Local,
                          recompute: float, samples: Sequence[Any], result: StepResult,
                          mine: tuple[int, Group, MicroBatch], start: float) -> Tensor:
        """Forward and backward of this rank's tokens `local` of the stream of `seq_ids`, recorded
        as the rank's (wave, group, micro-batch) `mine`, timed from `start`: from before its
        shard was made, so a micro-batch's seconds (what `ballast profile` fits) hold the
        layouts' set-up that a wave's busy time (what a step measures) holds; returns the
        (detached) loss share."""
        recompute_layers = round(recompute * self.model.shape.layers)
        meter = ActivationMeter() if self.measure_activations else None
        with meter or contextlib.nullcontext(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            # The model's loss is summed over its tokens: the normaliser is the whole batch's.
            loss = self.model.loss([samples[i] for i in seq_ids], stream, local, recompute_layers) / plan.tokens
        # Every rank of the group runs backward, an empty shard too: its all-to-alls are awaited.
        self._before_backward()
        loss.backward()
        self._shares.append((seq_ids, loss.detach()))
        wave, group, mb = mine
        result.micro_batches.append(MicroBatchRecord(
            wave, group.degree, list(mb.seq_ids), held_tokens(local, stream.bounds[-1]), recompute_layers,
            self._clock() - start, meter.bytes if meter else None))
        return loss.detach()

    def _before_backward(self) -> None:
        """Count a backward pass; arm the gradient sync before the rank's last of the step."""
        self._passes_left -= 1
        if self._passes_left == 0 and self.sync is not None:
            self.sync.arm()

    def _skip(self) -> Tensor:
        """An empty micro-batch: nothing to run, except under FSDP, where this rank must still join
        the pass's parameter all-gathers and gradient reduce-scatters: a pass on one dummy token
        whose loss counts zero."""
        if self.fsdp:
            dummy = self.model.dummy_sample()
            stream = PackedStream.of([self.model.sample_shape(dummy)], self.device)
            (self.model.loss([dummy], stream, slice(0, stream.bounds[-1])) * 0.0).backward()
        return torch.zeros((), device=self.device)

    def nonfinite_flags(self, samples: int) -> Tensor:
        """Per sample: 1 (or more) where a micro-batch holding it had a non-finite loss share here."""
        return nonfinite_flags(self._shares, samples, self.device)

    def _synchronise(self, loss: Tensor, nonfinite: Tensor) -> tuple[float, float, Tensor]:
        """Finish the gradient sync, then all-reduce the loss, the per-sample non-finite flags
        and the gradient's sum of squares in one collective (`world_statistics`); returns the
        batch loss, the gradient norm and the summed flags. Every squared entry is counted once
        over the world: where ranks hold shares of the summed gradients (FSDP2's shards, ZeRO-1's
        owned parameters, a TP rank's split weights) each adds its own; what ranks hold alike
        (the gradients every pool rank holds when replicated, the TP group's whole parameters:
        the norms) the first of them adds. A TP group's ranks hold the same loss and flags: its
        first rank adds them. Under PP each stage's pools hold that stage's parameters, and
        the last stage alone the loss and flags: the world's sum counts each once."""
        self.finish_gradients()
        first = self.tp_index == 0
        held = [p.grad for n, p in zip(self.parameter_names, self._params)
                if p.grad is not None and (first or self.tensor_parallel.is_split(n))]
        return world_statistics(loss, nonfinite, (g.to_local() if self.fsdp else g for g in held), adds_loss=first,
                                adds_grads=self.fsdp or self.sync.sharded or self.rank == 0, group=self.groups.job)
