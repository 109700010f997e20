"""Models the runtime trains: plain single-device code behind the runtime's model protocol
(`protocol.ParallelModel`); parallelism is applied by `ballast.runtime.parallelize`.

    protocol.py  ParallelModel, PackedStream, AttentionFn: all the runtime knows of a model
    gpt.py       ballast's Llama-style decoder
    kernels.py   causal attention per packed sequence (flash-attn / torch varlen on CUDA, SDPA)
"""
from .gpt import GPT, build_gpt, local_attention
from .kernels import varlen_causal_attention
from .protocol import AttentionFn, PackedStream, ParallelModel, sequence_positions

__all__ = ["GPT", "AttentionFn", "PackedStream", "ParallelModel", "build_gpt", "local_attention",
           "sequence_positions", "varlen_causal_attention"]
