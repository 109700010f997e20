"""Hugging Face causal LMs behind the runtime's model protocol, the model objects unmodified.

`HFCausalLM` wraps a `transformers` causal LM (Llama, Qwen2, Mistral and their relatives: any
whose attention goes through transformers' `AttentionInterface`) and implements
`protocol.ParallelModel`. Nothing in the model class is patched:

  - attention: ballast registers an attention function under the name "ballast" with
    `AttentionInterface` and selects it on the model with `set_attn_implementation`. It has no
    mask function (transformers then builds no mask: attention is causal per packed sequence,
    from the stream's cu_seqlens, and a [tokens x tokens] mask would cost quadratic memory). transformers calls it with q, k, v after the model's own
    projections and RoPE; it hands them to the installed `AttentionFn` (the runtime's Ulysses
    attention, or attention over the tokens this process holds), reached through the forward's
    keyword arguments, which transformers passes down to the attention function untouched;
  - positions: `position_ids` is each token's position inside its own sequence
    (`PackedStream.positions`), so the model's RoPE, scaled variants included, rotates the
    tokens of a shard exactly as it would the whole sequence;
  - recomputation: transformers' decoder layers recompute themselves when their
    `gradient_checkpointing` attribute is set; the plan's level sets it per layer and per
    micro-batch (the first k layers), non-reentrant, instead of the model-wide switch.

Loss, its normalisation by the step's tokens and the label shift across shard boundaries are
the runtime's, as for every model: the wrapper returns logits of the tokens this process holds.

Pipeline stages (`keep_stage`): the decoder keeps its stage's layers (under their own names),
the embedding only on the first stage, the final norm (else an identity) and output layer only
on the last; a later stage hands the decoder its input as `inputs_embeds`, and a stage without
the output layer returns the decoder's hidden states.

Reading a part (`hf_part_load`): where the folder's files hold every tensor under the model's
own names, a rank builds the model without weights (parameters on the meta device through
accelerate's `init_empty_weights`, buffers such as RoPE's frequencies made as transformers makes
them), keeps its stage and TP shard and reads only their tensors from the files.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import itertools
import math
from typing import Iterator

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..vocabulary.model_shape import ModelShape
from .hf_weights import StoredWeights, check_finite, weight_files
from .kernels import local_attention
from .next_token import NextTokenObjective
from .protocol import VOCAB_EMBEDDING, VOCAB_OUTPUT, AttentionFn, PackedStream, PartLoad
from .stage_layers import StageLayers

ATTENTION = "ballast"
"""The name ballast's attention function is registered under in transformers."""
UNSUPPORTED = {"softcap": "attention logit softcapping", "s_aux": "attention sinks", "sinks": "attention sinks",
               "position_bias": "an additive attention position bias"}
"""Keyword arguments some families pass their attention function that change what it computes
(Gemma 2's softcapping, gpt-oss' sinks, ...): an error when set, never silently ignored."""


def _attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
               scaling: float | None = None, dropout: float = 0.0, **kwargs) -> tuple[Tensor, None]:
    """transformers' attention-function signature over ballast's `AttentionFn`: q [1, H, n, hd],
    k and v [1, KV, n, hd] in, [1, n, H, hd] out (the layout transformers' own functions return)."""
    stream: PackedStream | None = kwargs.get("ballast_stream")
    attend: AttentionFn | None = kwargs.get("ballast_attend")
    if stream is None or attend is None:
        raise ValueError(f"{type(module).__name__}: the 'ballast' attention runs inside ballast's HFCausalLM only "
                         f"(it needs the packed stream); select another attn_implementation to use the model alone")
    if dropout:
        raise ValueError(f"{type(module).__name__}: attention dropout {dropout} is not supported (the gradient "
                         f"would depend on the plan); set attention_dropout to 0")
    for name, feature in UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise ValueError(f"{type(module).__name__} uses {feature} ({name}), which ballast's attention (plain "
                             f"causal softmax) does not implement: training would silently change the model")
    if kwargs.get("is_causal", getattr(module, "is_causal", True)) is False:
        raise ValueError(f"{type(module).__name__}: bidirectional (non-causal) attention is not supported: "
                         f"ballast trains causal LMs")
    window = kwargs.get("sliding_window")
    longest = max(b - a for a, b in zip(stream.bounds, stream.bounds[1:]))
    if window is not None and longest > window:
        raise ValueError(f"{type(module).__name__}: sliding-window attention (window {window}) over a sequence "
                         f"of {longest} tokens is not supported: ballast attends over whole sequences")
    rows = query.shape[2] - kwargs.get("ballast_pad", 0)
    q, k, v = (t[0, :, :rows].transpose(0, 1) for t in (query, key, value))
    head_dim = q.shape[-1]
    if scaling is not None and not math.isclose(scaling, head_dim ** -0.5, rel_tol=1e-12):
        q = q * (scaling * math.sqrt(head_dim))  # the kernels scale by 1/sqrt(head_dim)
    out = attend(q, k, v, stream)
    if rows < query.shape[2]:  # the stand-in row of an empty shard (see HFCausalLM.forward)
        out = torch.cat([out, out.new_zeros(query.shape[2] - rows, *out.shape[1:])])
    return out[None], None


@functools.cache
def register() -> None:
    """Register ballast's attention with transformers, once."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, _attention)


class HFCausalLM(NextTokenObjective, nn.Module):
    """A transformers causal LM as a `ParallelModel`; `hf` is the model object itself."""

    def __init__(self, hf: nn.Module, shape: ModelShape):
        super().__init__()
        check_supported(hf, shape)
        register()
        hf.set_attn_implementation(ATTENTION)
        self.hf = hf
        self.shape = shape
        self._attend: AttentionFn = local_attention
        for layer in self.blocks():
            layer._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=False)

    def blocks(self) -> nn.ModuleList:
        return self.hf.get_decoder().layers

    def install_attention(self, attend: AttentionFn) -> None:
        self._attend = attend

    def tensor_parallel_plan(self) -> dict[str, str]:
        """transformers' own split of the decoder, its config's `base_model_tp_plan` (Llama and its
        relatives: q, k, v, gate and up colwise, o and down rowwise), under the base model's name,
        with the embedding and the output layer split by vocabulary where this model (or its
        pipeline stage) holds them (`protocol.TensorParallelModel`). The attention reshapes its
        projections to [tokens, -1, head_dim], so a rank's share of the heads needs no change to
        the model."""
        plan = getattr(self.hf.config, "base_model_tp_plan", None)
        if not plan:
            raise ValueError(f"model type {self.hf.config.model_type!r}: its config has no base_model_tp_plan, so "
                             f"transformers does not say how tensor parallelism splits it")
        names = {id(module): name for name, module in self.named_modules()}
        ends = [(self.hf.get_input_embeddings(), VOCAB_EMBEDDING), (self.hf.get_output_embeddings(), VOCAB_OUTPUT)]
        return {**{f"hf.{self.hf.base_model_prefix}.{name}": style for name, style in plan.items()},
                **{names[id(module)]: style for module, style in ends if module is not None}}

    @property
    def holds_embedding(self) -> bool:
        return self.hf.get_decoder().embed_tokens is not None

    @property
    def holds_head(self) -> bool:
        return self.hf.lm_head is not None

    def keep_stage(self, layers: range, first: bool, last: bool) -> None:
        """Keep a pipeline stage's part (`protocol.StagedModel.keep_stage`): its decoder layers,
        the embedding on the first stage, the final norm and output layer on the last. A later
        stage hands its input to the decoder as `inputs_embeds`, which must then reach the first
        layer unchanged (`check_stageable`)."""
        check_stageable(self.hf, first, last)
        decoder = self.hf.get_decoder()
        decoder.layers = StageLayers(decoder.layers, layers)
        if not first:
            decoder.embed_tokens = None
        if not last:
            decoder.norm = nn.Identity()
            self.hf.lm_head = None

    def forward(self, inputs: Tensor, stream: PackedStream, recompute_layers: int = 0) -> Tensor:
        """Logits [tokens, vocab] of the tokens this process holds (see `protocol.ParallelModel`),
        or the decoder's hidden states [tokens, hidden] where a pipeline stage holds no output
        layer; from token ids, or where it holds no embedding from the previous stage's hidden
        states [tokens, hidden]."""
        rank = 1 if self.holds_embedding else 2
        if inputs.dim() != rank or inputs.shape[0] != stream.positions.shape[0]:
            raise ValueError(f"inputs of shape {tuple(inputs.shape)} do not match the stream's "
                             f"{stream.positions.shape[0]} positions ({'token ids' if rank == 1 else 'hidden states'})")
        layers = self.blocks()
        if not 0 <= recompute_layers <= len(layers):
            raise ValueError(f"recompute_layers {recompute_layers} is outside 0..{len(layers)}")
        for i, layer in enumerate(layers):
            layer.gradient_checkpointing = i < recompute_layers
        # A rank may hold no token of a micro-batch (a stream shorter than its group) and must
        # still join the group's all-to-alls; transformers' layers cannot reshape zero tokens, so
        # the rank runs one stand-in token that attention leaves out and the output drops.
        rows = inputs.shape[0]
        pad = int(rows == 0)
        positions = stream.positions
        if pad:
            inputs, positions = inputs.new_zeros(1, *inputs.shape[1:]), positions.new_zeros(1)
        feed = dict(input_ids=inputs[None]) if self.holds_embedding else dict(inputs_embeds=inputs[None])
        feed.update(position_ids=positions[None], use_cache=False, ballast_stream=stream, ballast_attend=self._attend,
                    ballast_pad=pad)
        if not self.holds_head:
            return self.hf.get_decoder()(**feed).last_hidden_state[0, :rows]
        # A boolean `logits_to_keep` makes transformers select the kept positions' hidden states
        # (batch dimension and stand-in token dropped) before its output layer, whose logits are
        # then the [rows, vocab] this returns. Slicing its [1, tokens, vocab] logits instead would
        # return a view, which FSDP2 warns may lose the root's pre-backward hook to an in-place op.
        keep = torch.full((1, inputs.shape[0]), not pad, dtype=torch.bool, device=inputs.device)
        return self.hf(**feed, logits_to_keep=keep).logits


def check_stageable(hf: nn.Module, first: bool, last: bool) -> None:
    """ValueError naming the model type and why it cannot be cut into pipeline stages here, before
    anything is dropped: tied embedding and output weights would live on two stages; a decoder
    without `embed_tokens`, `layers`, `norm` or the model without `lm_head` has nothing to drop by
    those names; and a later stage's input goes through the decoder as `inputs_embeds`, so a
    decoder that transforms them before its first layer (Gemma scales them by sqrt(hidden))
    would transform them on every stage. The last is probed: the decoder without layers or
    norm must return a random input unchanged."""
    kind = getattr(hf.config, "model_type", type(hf).__name__)
    decoder = hf.get_decoder()
    missing = [name for name, owner in (("embed_tokens", decoder), ("layers", decoder), ("norm", decoder),
                                        ("lm_head", hf)) if not hasattr(owner, name)]
    if missing:
        raise ValueError(f"model type {kind!r}: no {', '.join(missing)} to split into pipeline stages")
    if getattr(hf.config, "tie_word_embeddings", False) and not (first and last):
        raise ValueError(f"model type {kind!r}: tied embedding and output weights cannot be split over pipeline "
                         f"stages (the first and last stage would each hold a copy); untie them or run without --pp")
    if first:
        return
    # The probe runs on a shell of the decoder's class and config on the host, without layers
    # and with a vocabulary of 2: the model itself may be on the meta device (a strategy's
    # compute model, built without weights) or too large to run a probe on where it is.
    config = copy.deepcopy(hf.config)
    config.vocab_size, config.pad_token_id, config.num_hidden_layers = 2, None, 0
    if getattr(config, "layer_types", None):
        config.layer_types = []
    with torch.device("cpu"):
        shell = type(decoder)(config)
    shell.layers, shell.norm = nn.ModuleList(), nn.Identity()
    probe = torch.randn(1, 2, hf.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = shell(inputs_embeds=probe, position_ids=torch.arange(2)[None], use_cache=False).last_hidden_state
    if not torch.equal(out, probe):
        raise ValueError(f"model type {kind!r}: its decoder transforms the input embeddings before the first layer, "
                         f"so a pipeline stage cannot hand it the previous stage's hidden states; run without --pp")


def check_supported(hf: nn.Module, shape: ModelShape) -> None:
    """ValueError naming the model type and the feature ballast cannot train exactly, before any
    rank communicates."""
    config = hf.config
    kind = getattr(config, "model_type", type(hf).__name__)
    if not getattr(hf, "_supports_attention_backend", False):
        raise ValueError(f"model type {kind!r}: its attention does not go through transformers' "
                         f"AttentionInterface, so ballast cannot install sequence-parallel attention")
    if getattr(config, "attention_dropout", 0.0):
        raise ValueError(f"model type {kind!r}: attention_dropout {config.attention_dropout} is not supported "
                         f"(the gradient would depend on the plan); set it to 0")
    if not hasattr(hf.get_decoder(), "layers"):
        raise ValueError(f"model type {kind!r}: no decoder layer list (model.layers) to recompute and shard")
    if "position_ids" not in inspect.signature(hf.forward).parameters:
        raise ValueError(f"model type {kind!r}: its forward takes no position_ids, so a shard's tokens cannot be "
                         f"given their positions inside their own sequences")
    if "logits_to_keep" not in inspect.signature(hf.forward).parameters:
        raise ValueError(f"model type {kind!r}: its forward takes no logits_to_keep, so the logits of a shard's "
                         f"tokens cannot be selected before its output layer")


_LOADS = itertools.count()
"""Weight loads of this process, to show transformers' loading bar for the first one alone."""


def _shows_loading() -> bool:
    """Whether this load shows transformers' "Loading weights" bar: the first load of a job's
    rank 0 alone, so a command shows one, not one per rank and per model built (a 4-rank verify
    builds the model once per planner on every rank, and once more for its reference outside
    the job: it printed 21 bars)."""
    import torch.distributed as dist

    first = next(_LOADS) == 0
    return first and dist.is_initialized() and dist.get_rank() == 0


@contextlib.contextmanager
def progress_bars(shown: bool) -> Iterator[None]:
    """transformers' progress bars on (`shown`) or off inside, as they were after."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    (logging.enable_progress_bar if shown else logging.disable_progress_bar)()
    try:
        yield
    finally:
        (logging.enable_progress_bar if was else logging.disable_progress_bar)()


WRAPPER_PREFIX = "hf."
"""State-dict keys of `HFCausalLM` are the transformers model's under its attribute `hf`."""


def build_hf(shape: ModelShape, seed: int = 0, load: bool = True) -> HFCausalLM:
    """The model of `shape.source` (`hf:PATH`) at `shape.layers` decoder layers: its weights when
    the folder has them (`model.safetensors`, sharded or not) and `load`, else a random init
    from its config that depends only on `seed` (every rank builds the same model). Nothing is
    fetched."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = shape.hf_folder
    assert folder is not None, shape.source
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    config.num_hidden_layers = shape.layers  # profiling builds reduced-depth copies
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if load and weight_files(folder):  # check_weights (check_buildable) found them whole and fitting
            with progress_bars(shown=_shows_loading()):
                hf = AutoModelForCausalLM.from_pretrained(folder, config=config, local_files_only=True,
                                                          dtype=torch.float32)
            check_finite(folder, hf.state_dict())
        else:
            hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    hf.train()
    return HFCausalLM(hf, shape)


def hf_part_load(shape: ModelShape) -> PartLoad | None:
    """How a rank reads its part of `shape`'s folder (module docstring): None for a folder without
    weights (every rank draws the whole model from its seed) or one whose keys are not the
    model's own names (transformers renames some on load: the whole model is loaded then)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = shape.hf_folder
    assert folder is not None, shape.source
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    config.num_hidden_layers = shape.layers

    def skeleton() -> HFCausalLM:
        with init_empty_weights(include_buffers=False):
            hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        hf.tie_weights()  # accelerate's meta parameters replaced the tied one by a copy of its own
        hf.train()
        return HFCausalLM(hf, shape)

    if not weight_files(folder):
        return None
    stored = StoredWeights(folder)
    checked = [skeleton()]
    if not stored.holds_every_key(checked[0].hf):
        return None

    def build() -> HFCausalLM:
        # The skeleton whose keys were checked serves the first build (a 70B config's module
        # tree takes seconds to make, even on meta); later builds (a strategy's) make their own.
        return checked.pop() if checked else skeleton()

    return PartLoad(build, lambda part, held: stored.read_part(part, WRAPPER_PREFIX, held),
                    lambda name: stored.read(name.removeprefix(WRAPPER_PREFIX), torch.float32))
