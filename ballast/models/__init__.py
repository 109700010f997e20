"""Models the runtime trains: plain single-device code behind the runtime's model protocol
(`protocol.ParallelModel`); parallelism is applied by `ballast.runtime.parallelize`.

    protocol.py  ParallelModel, PackedStream, AttentionFn: all the runtime knows of a model;
                 StagedModel: what a pipeline stage needs of a text model
    stage_layers.py  a pipeline stage's blocks under their whole-model names
    gpt.py       ballast's Llama-style decoder
    hf.py        Hugging Face causal LMs (`hf:PATH`), through transformers' AttentionInterface
    hf_weights.py  a Hugging Face folder's weights checked against its config before any load
    next_token.py  the text models' objective (next-token cross-entropy over a packed stream)
    kernels.py   attention inside every span of a packed stream (flash-attn / torch varlen on CUDA, SDPA)
    gaussian_clips.py  Gaussian clips with the conditions a video model takes (verify, profile)
    flow.py      the video models' objective: rectified flow on patch tokens
    video_conditioning.py  the video DiTs' timestep and condition embeddings, held samples
    video_layers.py  the video DiTs' layers: adaLN-zero blocks with RoPE self-attention of one
                 pattern and cross-attention, final layer
    video_dit.py VideoDiT: what both video DiTs share (the protocol, the loss)
    stdit.py     STDiT3-style DiT: spatial and temporal blocks in turn
    dit.py       Wan-style DiT: full attention over every clip
    clip_objective.py  the video models' sample checks and loss around their forward
    condition_attention.py  cross-attention of every held token to its own sample's condition
    diffusers_wan.py  diffusers' Wan transformers (`diffusers:PATH`), the model object run per token
    wan_attention.py  ballast's attention inside them, through diffusers' attention processors
"""
from typing import Callable

import torch
from torch import nn

from ..vocabulary.model_shape import DIFFUSERS_PREFIX, HF_PREFIX, ModelShape
from ..vocabulary.patterns import CAUSAL_LM, AttentionPattern
from .dit import DiT, build_dit
from .gpt import GPT, build_gpt
from .kernels import local_attention, varlen_attention
from .protocol import INPUT, AttentionFn, PackedStream, ParallelModel, PartLoad, attention_spans, sequence_positions
from .stdit import STDiT, build_stdit


VIDEO_MODELS: dict[AttentionPattern, Callable[[ModelShape], nn.Module]] = {STDiT.PATTERN: STDiT, DiT.PATTERN: DiT}
"""The video DiT of each attention pattern (`ModelShape.pattern`)."""
BUILDERS: dict[AttentionPattern, Callable[[ModelShape, int], ParallelModel]] = {
    CAUSAL_LM: build_gpt, STDiT.PATTERN: build_stdit, DiT.PATTERN: build_dit}
"""ballast's own model of each attention pattern."""


def check_buildable(shape: ModelShape) -> None:
    """Raise ValueError unless `build_model` can build `shape`: what train, profile, verify and
    bench check before any rank starts. A video DiT's constructor checks its shape (even depth
    for STDiT, the patch values as vocab, ...): it runs here on the meta device, which
    allocates nothing."""
    if shape.source is not None and shape.hf_folder is None and shape.diffusers_folder is None:
        raise ValueError(f"model {shape.name!r}: unknown source {shape.source!r} (expected {HF_PREFIX}PATH or "
                         f"{DIFFUSERS_PREFIX}PATH)")
    if shape.hf_folder is not None:
        from .hf_weights import check_weights
        check_weights(shape.hf_folder)
    if shape.diffusers_folder is not None:
        from .diffusers_wan import check_wan_folder
        check_wan_folder(shape)
    if shape.source is None and shape.pattern in VIDEO_MODELS:
        with torch.device("meta"):
            VIDEO_MODELS[shape.pattern](shape)


def build_model(shape: ModelShape, seed: int = 0, *, weights: bool = True) -> ParallelModel:
    """The model `shape` describes, with weights that depend only on `seed` unless it brings its
    own: ballast's GPT, a video DiT (STDiT for spatial-temporal attention, DiT for full), or the
    Hugging Face model of `shape.source` (transformers or diffusers imported only then), on the
    host. weights=False: its structure only, every tensor on the meta device (no weight read or
    drawn, no memory): a model whose trained weights and buffers the caller fills after cutting
    it (a strategy's compute model, `runtime/strategy.py`)."""
    check_buildable(shape)
    if not weights:
        with torch.device("meta"):
            return _build(shape, seed, load=False)
    return _build(shape, seed, load=True)


def part_load(shape: ModelShape) -> PartLoad | None:
    """How a rank reads only its part of the model's weights (`PartLoad`): a Hugging Face causal
    LM's folder whose files name every tensor as the model does; None for every other model,
    which each rank builds whole (its seed's weights, or a diffusers folder's)."""
    check_buildable(shape)
    if shape.hf_folder is None:
        return None
    from .hf import hf_part_load
    return hf_part_load(shape)


def _build(shape: ModelShape, seed: int, load: bool) -> ParallelModel:
    if shape.hf_folder is not None:
        from .hf import build_hf
        return build_hf(shape, seed, load=load)
    if shape.diffusers_folder is not None:
        from .diffusers_wan import build_wan
        return build_wan(shape, seed, load=load)
    return BUILDERS[shape.pattern](shape, seed)


__all__ = ["DiT", "GPT", "INPUT", "STDiT", "AttentionFn", "PackedStream", "ParallelModel", "PartLoad",
           "attention_spans", "build_dit", "build_gpt", "build_model", "build_stdit", "check_buildable", "part_load",
           "local_attention", "sequence_positions", "varlen_attention"]
