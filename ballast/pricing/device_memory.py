"""What a rank holds besides the activations its micro-batches save, per sharding mode: the
terms `get_cost_model` adds to every cost model (docs/design.md, section 4, gives the formulas).

With P parameters (A of them in linear layers), N ranks, fp32 parameters and AdamW:

    mode        parameters   gradients   optimizer   while a micro-batch runs     after backward
    replicated  4 P          4 P         8 P         autocast copies              AdamW's temporaries
    zero1       4 P          4 P         8 P / N     autocast copies              AdamW's temporaries
    fsdp        4 P / N      4 P / N     8 P / N     gathered units               the root's, its buffer
    canonical   4 P + 4 M/N  4 P         8 M / N     autocast copies              one full block's, 4 M / N

Autocast copies: 2 A under bf16 (autocast casts every linear layer's weight and bias, and each
copy stays saved for backward); none under FSDP2, whose units are gathered in bf16. The loss holds 12 bytes per token and vocabulary entry at its
backward (`LOSS_VALUES`), on the ranks holding those tokens; `loss_per_token`. The reduction
buffer is `reduction_buffer_bytes`. Parameters and gradients stay fp32 under bf16 autocast
(the runtime's precision: autocast, not bf16 weights); only FSDP2's gathered copies are bf16.

Under a strategy (`canonical`, `Sharding.CANONICAL`) P is a rank's compute parameters (its stage's
TP shard, gathered whole each step) and M the whole model's, of which each of the job's N ranks
holds the canonical 1 / N share (`CanonicalLayout`): its fp32 parameters of record and AdamW's
state. After backward the reduction into it holds one full block's fp32 gradients at a time (the
runtime reduce-scatters layer by layer) and the rank's share of the reduced gradients.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..vocabulary.model_shape import ModelShape
from ..vocabulary.sharding import Sharding

FP32, BF16 = 4, 2
ADAM_VALUES = 2  # AdamW's fp32 momentum and variance per parameter
LOSS_VALUES = 3
"""fp32 [tokens, vocab] tensors alive at the cross-entropy's backward, while every activation
is still saved: the log-probabilities log_softmax saved, the gradient it receives from the
NLL and the one it returns (measured: 12 bytes per token and entry under fp32 and bf16 alike;
the forward's peak, the bf16 logits, their fp32 cast and the log-probabilities, is 10)."""
FSDP_GATHERED_BLOCKS = 2
"""Blocks whose parameters FSDP2 holds unsharded at once: the one running and the one its
backward prefetches."""


@dataclass(frozen=True)
class ParameterCounts:
    """A model's parameters, as its memory depends on them."""

    total: int
    autocast: int
    """Parameters bf16 autocast copies: the linear layers' weights and biases (embeddings and
    norms are used in fp32)."""
    block: int
    """Parameters of the largest block (FSDP2's unit besides the root)."""
    root: int
    """Parameters in no block (embeddings, output layer, final norm, a DiT's conditioning):
    FSDP2's root unit, which stays gathered from forward to backward."""

    def __post_init__(self) -> None:
        assert 0 <= self.autocast <= self.total and 0 <= self.root <= self.total and self.block >= 0, self

    @classmethod
    def of_shape(cls, shape: ModelShape) -> ParameterCounts:
        """From the shape's formulas (`ModelShape.params`): what the analytic model knows."""
        block = shape.layer_matmul_params + 2 * shape.hidden
        return cls(total=shape.params, autocast=shape.layers * shape.layer_matmul_params + shape.vocab * shape.hidden,
                   block=block, root=shape.params - shape.layers * block)


def reduction_buffer_bytes(sharding: Sharding, counts: ParameterCounts) -> float:
    """Bytes the gradient reduction allocates on top of the gradients, as the runtime holds them:
    replicated and ZeRO-1 keep every fp32 gradient in the bucketed sync's buffers (`grad_sync.py`:
    each `.grad` a view of its bucket, reduced in place, no flat copy), so the reduction adds
    nothing to the 4 P of gradients; FSDP2 reduce-scatters each unit's gradients (a block's, the
    root's last) through an fp32 buffer of the unit's size (under bf16 too: the policy's reduce
    dtype)."""
    return FP32 * max(counts.block, counts.root) if sharding is Sharding.FSDP else 0.0


@dataclass(frozen=True)
class CanonicalLayout:
    """Where a strategy's state of record lives (`Sharding.CANONICAL`): the whole model's
    parameters, a 1 / ranks share of each on every rank of the job."""

    counts: ParameterCounts
    """The whole model's parameters (M)."""
    ranks: int
    """N: the job's ranks, every pipeline's."""

    @property
    def share(self) -> float:
        """Parameters of record one rank holds."""
        return self.counts.total / self.ranks


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes per rank besides activations, for a model, mode, precision and world."""

    counts: ParameterCounts
    sharding: Sharding
    bf16: bool
    """Forward under bf16 autocast (the GPU presets' precision; `--precision bf16`)."""
    world_size: int
    vocab: int
    """Entries of the loss's logits per token; 0 for a model whose loss has none (video)."""
    canonical: CanonicalLayout | None = None
    """Under `Sharding.CANONICAL`, the layout of record (else None)."""

    def __post_init__(self) -> None:
        assert (self.canonical is not None) == (self.sharding is Sharding.CANONICAL), self

    @property
    def _record(self) -> float:
        """Parameters of record this rank holds and steps beside its compute parameters (0 unless
        canonical)."""
        return self.canonical.share if self.canonical is not None else 0.0

    def _sharded(self, values: float, over: bool) -> float:
        return values / self.world_size if over else values

    @property
    def parameters(self) -> float:
        return self._sharded(FP32 * self.counts.total, self.sharding is Sharding.FSDP) + FP32 * self._record

    @property
    def gradients(self) -> float:
        return self._sharded(FP32 * self.counts.total, self.sharding is Sharding.FSDP)

    @property
    def optimizer(self) -> float:
        if self.canonical is not None:
            return ADAM_VALUES * FP32 * self._record
        return self._sharded(ADAM_VALUES * FP32 * self.counts.total, self.sharding is not Sharding.REPLICATED)

    @property
    def resident(self) -> float:
        """Parameters, gradients and optimizer state, held the whole step."""
        return self.parameters + self.gradients + self.optimizer

    @property
    def _gathers_bf16(self) -> bool:
        # FSDP2 under bf16 runs a MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
        # (runtime/fsdp.py): its units are gathered in bf16 (2 bytes per parameter, their
        # unsharded gradients too), so autocast finds bf16 weights and makes no copies of its
        # own, and gradients are still reduced in fp32 (measured: bench/results/memory.json).
        return self.bf16 and self.sharding is Sharding.FSDP

    @property
    def _unsharded(self) -> int:
        """Bytes per parameter of FSDP2's gathered units and their unsharded gradients."""
        return BF16 if self._gathers_bf16 else FP32

    @property
    def autocast_copies(self) -> float:
        """bf16 copies of the linear layers' parameters, saved for backward; none under FSDP2,
        which gathers them in bf16 (`_gathers_bf16`)."""
        return BF16 * self.counts.autocast if self.bf16 and not self._gathers_bf16 else 0.0

    @property
    def gathered(self) -> float:
        """FSDP2's unsharded parameters while a micro-batch runs: the root's (gathered from
        forward to the end of backward) and two blocks' (`FSDP_GATHERED_BLOCKS`). A block's
        unsharded gradients and its reduction buffer come as its activations go, and the
        root's gradients at the end (`after_backward`): measured, pricing them with the
        activations over-predicted FSDP's peak by 4-8% (bench/memory_fit.py). 0 unless FSDP."""
        if self.sharding is not Sharding.FSDP:
            return 0.0
        return self._unsharded * (self.counts.root + FSDP_GATHERED_BLOCKS * self.counts.block)

    @property
    def states(self) -> float:
        """What a micro-batch's forward and backward find held besides its activations: the
        cost model's `states`."""
        return self.resident + self.autocast_copies + self.gathered

    @property
    def after_backward(self) -> float:
        """The step's peak once backward has freed the activations: FSDP2's reduction buffer with
        the root's unsharded parameters and gradients (reduced last), or the optimizer
        step's temporaries (the foreach AdamW's square root of the variance of the parameters
        this rank updates), whichever is larger."""
        reduction = reduction_buffer_bytes(self.sharding, self.counts)
        if self.sharding is Sharding.FSDP:
            reduction += 2 * self._unsharded * self.counts.root
        if self.canonical is not None:  # one full block's gradients in flight, then the reduced share
            whole = self.canonical.counts
            return self.resident + FP32 * self._record + max(FP32 * max(whole.block, whole.root), FP32 * self._record)
        updated = self._sharded(FP32 * self.counts.total, self.sharding is not Sharding.REPLICATED)
        return self.resident + max(reduction, updated)

    @property
    def loss_per_token(self) -> float:
        """Bytes one held token adds at the loss's backward (`LOSS_VALUES`), not recomputed."""
        return LOSS_VALUES * FP32 * self.vocab

    def describe(self) -> str:
        return (f"{self.sharding.value}{', bf16 autocast' if self.bf16 else ''}: states "
                f"{self.states / 1e9:.3g} GB per device ({self.resident / 1e9:.3g} GB parameters, gradients and "
                f"optimizer), {self.after_backward / 1e9:.3g} GB after backward")
