"""What the runtime needs of a model: the protocol every model ballast trains implements.

The runtime (`ballast.runtime`) depends on this, not on a model: ballast's GPT, Hugging Face
causal LMs (`hf.py`) and the video DiTs implement it. A model is plain single-device code; the
runtime hands it a stream object that says which tokens this process holds and how they sit in
the packed micro-batch, and installs the sequence-parallel attention through the model's own
hook. No runtime, planner or CLI code names a model family.

    PackedStream      samples packed end to end: their bounds and shapes in the whole stream,
                      where every token this process holds sits, the attention pattern, and
                      `arrange`, the layout hook a video model calls before each attention
    AttentionFn       (q, k, v, stream) -> out, each [tokens held, heads, head_dim]: attention
                      of `stream.pattern` inside every sample, however the stream is sharded
    ParallelModel     shape (what the cost model prices), the loss of this process's tokens,
                      blocks (recomputation and FSDP units), install_attention; a user's model
                      with a forward of its own may add `reference_loss(samples)`, the loss of
                      the samples through that forward one by one, which verify compares with
    TensorParallelModel  a ParallelModel that tensor parallelism can split: which module splits
                      how (`tensor_parallel_plan`), and the hook of its loss over split logits
    StagedModel       what pipeline parallelism adds (text models): keep one stage's part,
                      and run it from token ids or the previous stage's hidden states
    PartLoad          a model whose weights a rank reads a tensor at a time (a Hugging Face
                      folder): its structure without weights, and the reader of a part's tensors

Token order. A text sample's tokens are its sequence; a clip's (frames, height, width) latent
patches are packed frame by frame, each frame row by row ("frame-major"). The runtime only
hands a model a contiguous slice of that order (`local`), or under context parallelism the
stream indices of its head and tail chunks; a layout that holds whole patch columns instead (2D
sequence parallelism) is one `arrange` returns and takes back.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor, nn

from ..vocabulary.model_shape import ModelShape
from ..vocabulary.patterns import CAUSAL, Span, span
from ..vocabulary.samples import Sample

INPUT = "input"
"""`PackedStream.arrange` target: the layout the model was handed (its `local` slice), where
its inputs and targets are."""


@dataclass(frozen=True)
class PackedStream:
    """Samples packed one after another into one token stream."""

    bounds: tuple[int, ...]
    """Where every sample starts in the whole stream, as Python ints: (0, n1, n1 + n2, ..., tokens)."""
    positions: Tensor
    """Where every token this process holds sits in its own sample: [tokens held] positions
    (0 at the sample's start; the rotary position a text model applies) for a text stream;
    [tokens held, 4] (sample index in the stream, frame, row, column) for a video stream."""
    grids: tuple[tuple[int, int, int], ...] | None = None
    """(frames, height, width) in latent patches of every sample of a video stream; None for text."""
    pattern: Span = CAUSAL
    """What the next attention call attends over (`patterns.Span`; a name is resolved to it when
    the stream is made); set by `arrange`."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", check_span(self.pattern))

    @classmethod
    def from_lengths(cls, lengths: Sequence[int], device: torch.device | str | None = None) -> PackedStream:
        """The whole stream of text sequences of these lengths, held by one process."""
        return cls(tuple(itertools.accumulate(lengths, initial=0)), sequence_positions(lengths, device))

    @classmethod
    def of(cls, samples: Sequence[Sample], device: torch.device | str | None = None) -> PackedStream:
        """The whole stream of these samples (text lengths, or clip shapes), held by one process."""
        if not any(isinstance(x, tuple) for x in samples):
            return cls.from_lengths(samples, device)
        grids = video_grids(samples)
        bounds = tuple(itertools.accumulate((math.prod(g) for g in grids), initial=0))
        return cls(bounds, video_positions(grids, torch.arange(bounds[-1]), bounds).to(device), grids)

    def arrange(self, x: Tensor, pattern: Span | str) -> tuple[Tensor, PackedStream]:
        """The rows `x` of the tokens held, laid out for attention of `pattern` (or back in the
        `INPUT` layout), with the stream that describes them: what a model calls before every
        attention whose pattern differs from the last. A stream held in stream order keeps its
        rows; the runtime's 2D sequence-parallel streams move whole frames or patch columns
        between ranks. `x` is [tokens held, ...]; per-token values that depend on where a token
        sits (positions, the sample a token belongs to) come from the returned stream."""
        if pattern == INPUT:
            return x, self
        return x, dataclasses.replace(self, pattern=check_span(pattern))


def check_span(pattern: Span | str) -> Span:
    """`pattern` as an `arrange` target: a `patterns.Span`, or its name resolved here (a
    ValueError naming the spans for any other)."""
    return pattern if isinstance(pattern, Span) else span(pattern)


def sequence_positions(lengths: Sequence[int], device: torch.device | str | None = None) -> Tensor:
    """0..s-1 for every sequence length s, concatenated."""
    counts = torch.tensor(list(lengths), dtype=torch.long)
    starts = torch.cumsum(counts, 0) - counts
    total = int(counts.sum())
    return (torch.arange(total) - torch.repeat_interleave(starts, counts)).to(device)


def video_grids(samples: Sequence[Sample]) -> tuple[tuple[int, int, int], ...]:
    """Every sample as a (frames, height, width) grid: a text sequence of s tokens is one row."""
    return tuple(tuple(x) if isinstance(x, tuple) else (1, 1, int(x)) for x in samples)


def video_positions(grids: Sequence[tuple[int, int, int]], tokens: Tensor, bounds: Sequence[int]) -> Tensor:
    """(sample, frame, row, column) [n, 4] of the stream's tokens `tokens` (indices into the
    frame-major stream whose samples have these grids and bounds)."""
    starts = torch.tensor(bounds[:-1], dtype=torch.long)
    sample = torch.searchsorted(torch.tensor(bounds[1:], dtype=torch.long), tokens, right=True)
    offset = tokens - starts[sample]
    grid = torch.tensor(grids, dtype=torch.long).view(-1, 3)[sample]
    height, width = grid[:, 1], grid[:, 2]
    per_frame = height * width
    return torch.stack([sample, offset // per_frame, offset % per_frame // width, offset % width], dim=1)


def attention_spans(stream: PackedStream) -> tuple[Tensor | None, tuple[int, ...]]:
    """(order, bounds) of `stream.pattern` over the whole stream in stream order: the attention
    is attention inside every span `bounds` of the stream's tokens taken in `order` (None:
    stream order). Frames are contiguous in the frame-major stream; patch columns are not, so
    `temporal` gathers every clip's tokens column by column."""
    return stream_spans(stream.grids, stream.bounds, stream.pattern)


def stream_spans(grids: Sequence[tuple[int, int, int]] | None, bounds: Sequence[int], pattern: Span
                 ) -> tuple[Tensor | None, tuple[int, ...]]:
    """`attention_spans` of a stream of these grids (None: text), sample bounds and pattern."""
    if pattern.whole_sample:
        return None, tuple(bounds)
    grids = grids or video_grids([b - a for a, b in zip(bounds, bounds[1:])])
    return pattern_spans(grids, bounds, pattern)


def pattern_spans(grids: Sequence[tuple[int, int, int]], bounds: Sequence[int], pattern: Span
                  ) -> tuple[Tensor | None, tuple[int, ...]]:
    """(order, span bounds) of the frames (SPATIAL) or patch columns (TEMPORAL) of a
    frame-major stream of clips with these grids and sample bounds (`attention_spans`; the
    runtime's 2D layouts cut the same orders at the same spans)."""
    assert not pattern.whole_sample, pattern
    if not grids:
        return None, (0,)
    # Vectorised over the samples (a micro-batch may hold hundreds of tiny clips).
    grid = torch.tensor(grids, dtype=torch.long).view(-1, 3)
    frames, per_frame = grid[:, 0], grid[:, 1] * grid[:, 2]
    # A sample's spans: its frames (spatial) or its columns (temporal), one after another.
    count, size = (frames, per_frame) if pattern.frames else (per_frame, frames)
    spans = (0, *torch.cumsum(torch.repeat_interleave(size, count), 0).tolist())
    if pattern.frames:
        return None, spans
    # Temporal: every clip's tokens column by column, each column frame by frame.
    tokens = frames * per_frame
    total = int(tokens.sum())
    starts = torch.tensor(bounds[:-1], dtype=torch.long)
    sample = torch.repeat_interleave(torch.arange(len(grids)), tokens, output_size=total)
    offset = torch.arange(total) - (torch.cumsum(tokens, 0) - tokens)[sample]
    column, frame = offset // frames[sample], offset % frames[sample]
    return starts[sample] + frame * per_frame[sample] + column, spans


AttentionFn = Callable[[Tensor, Tensor, Tensor, PackedStream], Tensor]

Local = slice | Tensor
"""The tokens of the whole stream a process holds, in row order: a contiguous slice, or (under
context parallelism, whose head and tail chunks are not contiguous) a LongTensor of stream
indices."""


def held_tokens(local: Local, tokens: int) -> int:
    """How many of a stream of `tokens` tokens `local` holds."""
    if isinstance(local, slice):
        start, stop, _ = local.indices(tokens)
        return max(0, stop - start)
    return local.numel()


def take(x: Tensor, local: Local) -> Tensor:
    """The rows of `x` (a whole stream's, on any device) that `local` holds, in row order."""
    return x[local] if isinstance(local, slice) else x.index_select(0, local.to(x.device))


@runtime_checkable
class ParallelModel(Protocol):
    """A model the runtime can run under any plan: an `nn.Module` (the runtime also uses its
    `parameters()` and `modules()`) with these members."""

    shape: ModelShape
    """What the cost model prices; `shape.layers` blocks, `shape.heads` that every SP degree
    must divide."""

    def loss(self, samples: Sequence[Any], stream: PackedStream, local: Local, recompute_layers: int = 0) -> Tensor:
        """The summed per-token loss of the tokens this process holds: `samples` are the
        micro-batch's samples in stream order (as the data gives them: token ids, clips),
        `local` the tokens of the whole stream this process holds, in row order (what
        `stream.positions` describes; `Local`: a slice, or stream indices under context
        parallelism). The first `recompute_layers` blocks keep only their
        input and are recomputed in backward (non-reentrant `torch.utils.checkpoint`)."""
        ...

    def sample_shape(self, sample: Any) -> Sample:
        """What the planner and the stream see of a sample: a text sample's trained tokens, a
        clip's (frames, height, width) in latent patches. ValueError if the model cannot take it."""
        ...

    def dummy_sample(self) -> Any:
        """A smallest sample (one token): the pass a rank makes when it has nothing to run but
        must join a sharded model's parameter gathers."""
        ...

    def blocks(self) -> Sequence[nn.Module]:
        """The repeated blocks in order: what recomputation counts and what FSDP shards one by one
        (the rest, embedding and head, is sharded as the root)."""
        ...

    def install_attention(self, attend: AttentionFn) -> None:
        """Route every self-attention of the model through `attend` (the runtime passes the
        sequence-parallel one)."""
        ...


COLWISE = "colwise"
"""A linear layer split by output rows over a TP group (q, k, v; the MLP's gate and up)."""
ROWWISE = "rowwise"
"""A linear layer split by input columns, its outputs summed over the group (attention's output
projection, the MLP's down projection)."""
VOCAB_EMBEDDING = "embedding"
"""The token embedding, split by vocabulary rows."""
VOCAB_OUTPUT = "output"
"""The output layer, split by vocabulary rows (column-parallel): its logits stay split, and the
model's loss runs over the split vocabulary (`TensorParallelModel.install_cross_entropy`)."""
TENSOR_PARALLEL_STYLES = (COLWISE, ROWWISE, VOCAB_EMBEDDING, VOCAB_OUTPUT)
"""How `TensorParallelModel.tensor_parallel_plan` may split a module (the first two as Hugging
Face's `base_model_tp_plan` names them)."""

CrossEntropy = Callable[[Tensor, Tensor], Tensor]
"""(logits [tokens, vocab entries held], targets [tokens]) -> the summed cross-entropy."""


@runtime_checkable
class TensorParallelModel(ParallelModel, Protocol):
    """A model that tensor parallelism (`runtime/tensor_parallel`) can split after it is built."""

    def tensor_parallel_plan(self) -> dict[str, str]:
        """Module name (as `named_modules` gives it; `*` stands for a block's index) -> how it is
        split, one of `TENSOR_PARALLEL_STYLES`, of the modules it holds (a pipeline stage's
        part names its embedding or output layer only where it keeps them). The split modules'
        heads and columns must be what the rest of the model reads per rank: attention reshapes its projections to
        [tokens, -1, head_dim], never to a head count of its own."""
        ...

    def install_cross_entropy(self, cross_entropy: CrossEntropy) -> None:
        """Score the logits with `cross_entropy` (the runtime passes one over split logits)."""
        ...


@runtime_checkable
class StagedModel(Protocol):
    """A `ParallelModel` a pipeline can cut into stages (`ballast.runtime.pipeline`): after the
    model is built alike on every rank, each keeps its stage's part (torchtitan's way)."""

    holds_embedding: bool
    """Whether it holds the token embedding: whole, or the first stage's part."""
    holds_head: bool
    """Whether it holds the final norm, output layer and loss: whole, or the last stage's part."""

    def keep_stage(self, layers: range, first: bool, last: bool) -> None:
        """Drop every module outside one stage: the blocks outside `layers` (the kept ones keep
        their names, so a checkpoint's keys are the whole model's whatever the stages), the
        embedding unless `first`, the final norm and output layer unless `last`. ValueError
        when the model cannot be cut so (its input embeddings transformed inside the decoder,
        tied embedding and output weights)."""
        ...

    def stage_forward(self, received: Tensor | None, samples: Sequence[Any], stream: PackedStream, local: Local,
                      recompute_layers: int = 0) -> Tensor:
        """The held tokens through the kept part: on the first stage from the samples
        (`received` None), else from `received`, the previous stage's output [tokens held,
        hidden]; returns on the last stage the summed loss of the held tokens (`loss`), else
        the hidden states [tokens held, hidden] the next stage receives. The first
        `recompute_layers` of the stage's own blocks are recomputed in backward."""
        ...


HeldBlock = Callable[[str, Tensor], "tuple[slice, ...] | None"]
"""For a tensor of a model part's state dict (its name, the part's tensor): the block of the
whole tensor the part holds, one slice per dimension (its TP shard's, its FSDP2 shard's rows
within that), or None where it holds it whole."""


@dataclass(frozen=True)
class PartLoad:
    """A model whose weights a rank reads a tensor at a time (a Hugging Face folder's
    safetensors): each rank builds the structure, keeps its part (its pipeline stage, its TP
    shard; `runtime/parallelize.py`) and reads only that part's tensors, so no host holds the
    whole model and its ranks need no turns (`runtime/build_turns.py`)."""

    skeleton: Callable[[], ParallelModel]
    """The model with its parameters on the meta device and its buffers made on the host."""
    fill: Callable[[nn.Module, HeldBlock], None]
    """Read every tensor of a part's state dict (the part on its device, its parameters given
    storage there, a DTensor's local shard) from the weights, the block `HeldBlock` names."""
    read: Callable[[str], Tensor]
    """The stored tensor of one state-dict name, whole, on the host, in the model's dtype (a
    strategy's model of record, read a unit at a time: `runtime/canonical.py`)."""
