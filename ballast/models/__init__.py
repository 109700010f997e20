"""Models the runtime trains: plain single-device code behind the runtime's model protocol
(`protocol.ParallelModel`); parallelism is applied by `ballast.runtime.parallelize`.

    protocol.py  ParallelModel, PackedStream, AttentionFn: all the runtime knows of a model
    gpt.py       ballast's Llama-style decoder
    hf.py        Hugging Face causal LMs (`hf:PATH`), through transformers' AttentionInterface
    next_token.py  the text models' objective (next-token cross-entropy over a packed stream)
    kernels.py   attention inside every span of a packed stream (flash-attn / torch varlen on CUDA, SDPA)
"""
from ..model_shape import HF_PREFIX, ModelShape
from .gpt import GPT, build_gpt
from .kernels import local_attention, varlen_attention
from .protocol import INPUT, PATTERNS, AttentionFn, PackedStream, ParallelModel, attention_spans, sequence_positions


def check_buildable(shape: ModelShape) -> None:
    """Raise ValueError unless `build_model` can build `shape`: what train, profile, verify and
    bench check before any rank starts."""
    if shape.attention != "causal" or shape.cross_attention:
        # The cost model and every planner price video DiTs; their modules are not built yet.
        raise ValueError(f"model {shape.name!r} is a video DiT ({shape.attention} attention): ballast can plan "
                         f"and simulate it (ballast simulate) but not yet train, profile or verify it")


def build_model(shape: ModelShape, seed: int = 0) -> ParallelModel:
    """The model `shape` describes, with weights that depend only on `seed` unless it brings its
    own: ballast's GPT, or the Hugging Face model of `shape.source` (transformers imported only then)."""
    if shape.hf_folder is not None:
        from .hf import build_hf
        return build_hf(shape, seed)
    check_buildable(shape)
    if shape.source is None:
        return build_gpt(shape, seed)
    raise ValueError(f"model {shape.name!r}: unknown source {shape.source!r} (expected {HF_PREFIX}PATH)")

__all__ = ["GPT", "INPUT", "PATTERNS", "AttentionFn", "PackedStream", "ParallelModel", "attention_spans", "build_gpt",
           "build_model", "check_buildable", "local_attention", "sequence_positions", "varlen_attention"]
