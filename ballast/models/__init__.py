"""Models the runtime trains: plain single-device code; parallelism is injected by `ballast.runtime`."""
from .gpt import GPT, PackedStream, build_gpt, local_attention, sequence_positions
from .kernels import varlen_causal_attention

__all__ = ["GPT", "PackedStream", "build_gpt", "local_attention", "sequence_positions",
           "varlen_causal_attention"]
