"""What a run's forward computes in: the one value `--precision` parses to and the runtime takes."""
from __future__ import annotations

from enum import Enum


class Precision(str, Enum):
    """The forward's precision. Under bf16 the forward runs under bf16 autocast (matmuls and
    attention in bf16, so are the values the all-to-alls and the K/V gathers move); parameters,
    gradients and AdamW stay fp32 in every case."""

    AUTO = "auto"
    """bf16 autocast on CUDA devices, fp32 elsewhere: what the cost model's presets assume (2-byte
    values on GPUs, 4 on the `cpu` cluster)."""
    BF16 = "bf16"
    """bf16 autocast on any device: on a CPU it runs the bf16 paths (autocast dtypes, the bytes
    exchanged, the tolerances) without a GPU; it does not reach flash-attn, NCCL or CUDA
    placement, which run on GPUs only."""
    FP32 = "fp32"
    """No autocast: fp32 everywhere, on GPUs too."""

    def autocast(self, device_type: str) -> bool:
        """Whether the forward runs under bf16 autocast on a device of this type ("cuda", "cpu")."""
        return self is Precision.BF16 or (self is Precision.AUTO and device_type == "cuda")

    def __str__(self) -> str:
        return self.value
