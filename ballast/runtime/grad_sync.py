"""The data-parallel gradient sync of replicated weights, overlapped with backward: each rank's
summed gradients reduced over the world in fixed-size buckets while its last backward of the
step still runs (PyTorch DDP's scheme, fitted to plans). FSDP2 has its own (`fsdp.py`).

Communication, on `ProcessGroups.gradients`, a communicator of the data-parallel ranks (the
whole world, or under tensor or pipeline parallelism the rank's pool) that carries nothing else (forward: none; backward: one collective per bucket):
  - replicated AdamW: a SUM all-reduce of the bucket; every rank gets the bucket's summed
    gradients, 2 (world - 1) / world of its bytes sent per rank (ring);
  - ZeRO-1 (`ZeroRedundancyOptimizer`, whose partition gives each parameter an owning rank): a
    SUM reduce-scatter of the bucket, laid out as one segment per owner (its parameters in
    model order), so each rank receives the summed gradients of the parameters it steps, half
    an all-reduce's bytes; the other parameters' `.grad` is then None. After AdamW steps the
    owner's share, `ZeroRedundancyOptimizer` broadcasts each parameter from its owner (ZeRO-1's
    all-gather of the parameters).

Gradients live in the buckets: each bucket is one flat fp32 buffer and, at the start of every
step (`start`), each parameter's `.grad` becomes a view of it, zeroed; backward accumulates into
it in place and the bucket's collective runs on it in place. No flat copy of all gradients: a
rank holds 4 bytes per parameter of gradients at any time, in-flight buckets included.

Buckets: the parameters in reverse model order (backward reaches the last layers first), cut
into consecutive buckets of at most `bucket_bytes` (a parameter larger than that alone). The
model is built alike on every rank, so the buckets are the same everywhere.

When: a gradient is final once the rank's last backward pass of the step has accumulated into
it; the executor knows from the plan which pass that is (a rank runs as many as its groups'
micro-batches, some none at all) and `arm`s the sync just before it. While armed, each
parameter's post-accumulate-grad hook marks it ready, and the buckets are launched
asynchronously in bucket order: bucket k once all its parameters are ready and buckets
0..k-1 are launched. `finish` launches what the last backward did not reach (parameters its
micro-batch does not use; every bucket of a rank without a pass) and waits for all of them,
before the optimizer steps. What overlaps: a rank's bucket reductions with the rest of its
last backward, and with the later waves when it is idle in them.

Why it cannot deadlock: every rank issues exactly one collective per bucket on the gradient
communicator, in bucket order (fixed at construction, whatever order the hooks fire in), and
nothing else runs on it: NCCL's rule, one order of collectives per communicator on all its
ranks, holds by construction. The sequence-parallel exchanges of backward (Ulysses, CP, remap,
video layouts) and the wave barriers run on other communicators, each in the plan's order on
all its ranks; they interleave with the bucket collectives in an order that may differ from
rank to rank, but neither waits for the other: a bucket collective is asynchronous and waited
for only in `finish`, which every rank reaches after its last wave. A rank whose last backward
is in wave 0 launches its buckets then and passes the later wave barriers while they wait for
the others' buckets.

Exactness: a bucket's sum is the same sum over the world of every rank's accumulated gradient
that the executor's one all-reduce took (`executor.py`: the loss normaliser, the batch's
tokens, and remapping are in each rank's gradient already), grouped by bucket.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup

from ..vocabulary.sharding import BUCKET_BYTES



@dataclass
class Bucket:
    """One flat gradient buffer and the parameters whose gradients are views of it."""

    params: list[Tensor]
    """In the buffer's order: model order within each owner's segment."""
    buffer: Tensor
    segments: list[int]
    """Elements per rank's segment under ZeRO-1 (rank order); [numel] when replicated."""
    ready: set[int] = field(default_factory=set)
    """Indices (in `params`) of the parameters whose gradient is final, marked while armed."""
    work: dist.Work | None = None
    """The collective in flight."""


class GradSync:
    """Reduces the gradients of `params` over `group` in buckets during each step's last backward.

    group: the data-parallel ranks, the pool's (the whole world without tensor or pipeline
    parallelism), in order (`ProcessGroups.gradients`); owners: each parameter's owning rank in
    it under ZeRO-1 (`zero1_owners`), None when replicated."""

    def __init__(self, params: list[Tensor], group: ProcessGroup, bucket_bytes: int = BUCKET_BYTES,
                 owners: list[int] | None = None):
        assert bucket_bytes >= 1, bucket_bytes
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.sharded = owners is not None
        self.owner = dict(zip(map(id, params), owners)) if owners is not None else {}
        self.buckets = [self._bucket(chunk) for chunk in chunks(list(reversed(params)), bucket_bytes)]
        self._launched = 0
        self._armed = False
        for b, bucket in enumerate(self.buckets):
            for i, p in enumerate(bucket.params):
                p.register_post_accumulate_grad_hook(functools.partial(self._ready, b, i))

    def _bucket(self, params: list[Tensor]) -> Bucket:
        # Model order inside a bucket (buckets are cut in reverse), grouped by owner under ZeRO-1.
        params = sorted(reversed(params), key=lambda p: self.owner.get(id(p), 0))
        sizes = [sum(p.numel() for p in params if self.owner[id(p)] == r) for r in range(self.world)] \
            if self.sharded else [sum(p.numel() for p in params)]
        assert len({(p.dtype, p.device) for p in params}) == 1, "a bucket holds gradients of one dtype and device"
        buffer = torch.zeros(sum(sizes), dtype=params[0].dtype, device=params[0].device)
        return Bucket(params, buffer, sizes)

    def start(self) -> None:
        """At a step's start: every gradient zero, a view of its bucket; nothing armed."""
        assert not self._armed and all(b.work is None for b in self.buckets)
        for bucket in self.buckets:
            bucket.buffer.zero_()
            bucket.ready.clear()
            offset = 0
            for p in bucket.params:
                p.grad = bucket.buffer[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
        self._launched = 0

    def arm(self) -> None:
        """Just before this rank's last backward of the step: gradients final from now on."""
        assert not self._armed
        self._armed = True

    def _ready(self, b: int, i: int, param: Tensor) -> None:
        """Parameter i of bucket b has its gradient accumulated (its post-accumulate-grad hook)."""
        if not self._armed:
            return
        bucket = self.buckets[b]
        # Backward accumulates in place; a .grad replaced during the step would not be reduced.
        assert param.grad is not None and param.grad._base is bucket.buffer, "a gradient left its bucket"
        assert i not in bucket.ready, "a gradient was accumulated twice in the last backward"
        bucket.ready.add(i)
        while self._launched < len(self.buckets) and \
                len(self.buckets[self._launched].ready) == len(self.buckets[self._launched].params):
            self._launch(self.buckets[self._launched])

    def _launch(self, bucket: Bucket) -> None:
        if self.sharded:
            segments = list(torch.split(bucket.buffer, bucket.segments))
            bucket.work = dist.reduce_scatter(segments[self.rank], segments, group=self.group, async_op=True)
        else:
            bucket.work = dist.all_reduce(bucket.buffer, group=self.group, async_op=True)
        self._launched += 1

    def finish(self) -> None:
        """After this rank's last wave: launch the buckets not yet launched, in order, and wait
        for every bucket. Under ZeRO-1 the gradients of other ranks' parameters become None."""
        while self._launched < len(self.buckets):
            self._launch(self.buckets[self._launched])
        for bucket in self.buckets:
            assert bucket.work is not None
            bucket.work.wait()
            bucket.work = None
        self._armed = False
        if self.sharded:
            for bucket in self.buckets:
                for p in bucket.params:
                    if self.owner[id(p)] != self.rank:
                        p.grad = None

    def whole(self, params: list[Tensor], group: ProcessGroup) -> list[Tensor]:
        """Every parameter's summed gradient on every rank, after `finish` (a collective, for
        checks: under ZeRO-1 each gradient is broadcast from its owner over `group`, the same
        ranks in the same order as the sync's on another communicator: the gradient group
        carries buckets only)."""
        if not self.sharded:
            return [p.grad for p in params]
        out = []
        for p in params:
            grad = p.grad if self.owner[id(p)] == self.rank else torch.empty_like(p)
            dist.broadcast(grad, group=group, group_src=self.owner[id(p)])
            out.append(grad)
        return out


def chunks(params: list[Tensor], bucket_bytes: int) -> list[list[Tensor]]:
    """Consecutive runs of `params` of at most `bucket_bytes` each (a larger parameter alone)."""
    chunks: list[list[Tensor]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if not chunks or size + nbytes > bucket_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(p)
        size += nbytes
    return chunks


def zero1_owners(optimizer: torch.optim.Optimizer, params: list[Tensor], group: ProcessGroup | None = None
                 ) -> list[int]:
    """Each parameter's owning rank (in `group`, the optimizer's: the world when None) in a
    `ZeroRedundancyOptimizer`'s partition (a collective: every rank names the parameters its
    local AdamW steps, and all gather them)."""
    index = {id(p): i for i, p in enumerate(params)}
    mine = [index[id(p)] for g in optimizer.optim.param_groups for p in g["params"]]
    gathered: list[list[int] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    owners = [-1] * len(params)
    for rank, indices in enumerate(gathered):
        for i in indices or []:
            owners[i] = rank
    assert -1 not in owners, "a parameter no rank's optimizer steps"
    return owners
