"""Models the runtime trains: plain single-device code behind the runtime's model protocol
(`protocol.ParallelModel`); parallelism is applied by `ballast.runtime.parallelize`.

    protocol.py  ParallelModel, PackedStream, AttentionFn: all the runtime knows of a model
    gpt.py       ballast's Llama-style decoder
    hf.py        Hugging Face causal LMs (`hf:PATH`), through transformers' AttentionInterface
    next_token.py  the text models' objective (next-token cross-entropy over a packed stream)
    kernels.py   attention inside every span of a packed stream (flash-attn / torch varlen on CUDA, SDPA)
    clip.py      Clip, the video sample: a latent, its condition (label or caption) and its key
    flow.py      the video models' objective: rectified flow on patch tokens
    video_layers.py  the video DiTs' layers: timestep and condition embeddings, adaLN-zero blocks
                 with RoPE self-attention of one pattern and cross-attention, final layer
    video_dit.py VideoDiT: what both video DiTs share (the protocol, the loss)
    stdit.py     STDiT3-style DiT: spatial and temporal blocks in turn
    dit.py       Wan-style DiT: full attention over every clip
"""
from ..model_shape import HF_PREFIX, ModelShape
from .dit import DiT, build_dit
from .gpt import GPT, build_gpt
from .kernels import local_attention, varlen_attention
from .protocol import INPUT, PATTERNS, AttentionFn, PackedStream, ParallelModel, attention_spans, sequence_positions
from .stdit import STDiT, build_stdit


def check_buildable(shape: ModelShape) -> None:
    """Raise ValueError unless `build_model` can build `shape`: what train, profile, verify and
    bench check before any rank starts."""
    if shape.attention != "causal" or shape.cross_attention:
        # The cost model and every planner price video DiTs; their modules are not built yet.
        raise ValueError(f"model {shape.name!r} is a video DiT ({shape.attention} attention): ballast can plan "
                         f"and simulate it (ballast simulate) but not yet train, profile or verify it")


def build_model(shape: ModelShape, seed: int = 0) -> ParallelModel:
    """The model `shape` describes, with weights that depend only on `seed` unless it brings its
    own: ballast's GPT, a video DiT (STDiT for spatial-temporal attention, DiT for full), or the
    Hugging Face model of `shape.source` (transformers imported only then)."""
    if shape.hf_folder is not None:
        from .hf import build_hf
        return build_hf(shape, seed)
    if shape.source is None and shape.attention == "spatial-temporal":
        return build_stdit(shape, seed)
    if shape.source is None and shape.attention == "full":
        return build_dit(shape, seed)
    check_buildable(shape)
    if shape.source is None:
        return build_gpt(shape, seed)
    raise ValueError(f"model {shape.name!r}: unknown source {shape.source!r} (expected {HF_PREFIX}PATH)")

__all__ = ["DiT", "GPT", "INPUT", "PATTERNS", "STDiT", "AttentionFn", "PackedStream", "ParallelModel",
           "attention_spans", "build_dit", "build_gpt", "build_model", "build_stdit", "check_buildable",
           "local_attention", "sequence_positions", "varlen_attention"]
