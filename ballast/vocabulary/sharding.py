"""How a job's ranks hold the model's state: replicated, ZeRO-1 or FSDP2 (`runtime/parallelize.py`
applies it; `pricing/device_memory.py` prices it)."""
from __future__ import annotations

import enum

from .cluster import Cluster

BUCKET_BYTES = 25 * 2**20
"""The replicated and ZeRO-1 gradient sync's bucket size (`runtime/grad_sync.py`, priced by
`pricing/whole_step.py`), PyTorch DDP's 25 MiB: large enough that a collective's latency is small
beside its bytes, small enough that the first bucket starts early in backward."""


class Sharding(enum.Enum):
    REPLICATED = "replicated"
    """Every rank holds every parameter, gradient and optimizer state (the commands' default)."""
    ZERO1 = "zero1"
    """The optimizer state sharded over the world (`--zero1`); parameters and gradients whole."""
    FSDP = "fsdp"
    """Parameters, gradients and optimizer state sharded over the world (FSDP2, `--fsdp`)."""
    CANONICAL = "canonical"
    """A heterogeneous strategy's mode (`vocabulary/strategy.py`, Hydraulis' "hot switching"): the
    parameters of record and their optimizer state sharded over every rank of the job, one flat
    shard of each tensor per rank; each step's pipelines gather their stages' TP shards from it
    as whole compute parameters and reduce their gradients back into it
    (`pricing/parameter_movement.py`). Chosen with a strategy, never by a flag."""

    @classmethod
    def of_flags(cls, zero1: bool, fsdp: bool) -> Sharding:
        """The mode the commands' `--zero1` / `--fsdp` flags choose (at most one of them)."""
        if zero1 and fsdp:
            raise ValueError("--zero1 and --fsdp both shard the optimizer state: choose one")
        return cls.FSDP if fsdp else cls.ZERO1 if zero1 else cls.REPLICATED

    @classmethod
    def flagged(cls) -> list[Sharding]:
        """The modes a job chooses by flag: every one but a strategy's own."""
        return [m for m in cls if m is not cls.CANONICAL]

    @classmethod
    def parse(cls, name: str) -> Sharding:
        """The mode named `name` (an argparse type)."""
        flags = [m.value for m in cls.flagged()]
        if name not in flags:
            raise ValueError(f"sharding must be one of {', '.join(flags)}, got {name!r}"
                             + (" (a strategy's own mode, which its pipelines choose)" if name == cls.CANONICAL.value
                                else ""))
        return cls(name)


def default_sharding(cluster: Cluster, pp: int = 1) -> Sharding:
    """The mode a user of `cluster` would run, where no flag says (simulate, bench settings), in
    a job of `pp` pipeline stages.

    GPU presets: FSDP. Their models (GPT-7B to 30B, Llama-3 8B, the video DiTs) hold 16 bytes of
    mixed-precision AdamW state per parameter: 112 GB for a 7B model, which replicated ranks
    (16 P each) or ZeRO-1 (8 P of parameters and gradients each) cannot hold on a 28-68 GB
    device, and FSDP (ZeRO-3) is what the systems the tables compare with (FlexSP, Zeppelin) run.
    The old cost model's 16 P / N per device was this mode. `cpu`: replicated, what `train`,
    `verify` and `bench` run without `--zero1` / `--fsdp`. Under PP (p > 1) GPU presets take
    ZeRO-1, Megatron's distributed optimizer: the runtime runs no FSDP2 under a pipeline
    (`check_pipeline_sharding`), and a stage's share of the model leaves room for whole
    parameters and gradients."""
    if cluster.value_bytes == 4:
        return Sharding.REPLICATED
    return Sharding.ZERO1 if pp > 1 else Sharding.FSDP


def check_pipeline_sharding(sharding: Sharding, pp: int) -> None:
    """Refuse FSDP2 under a pipeline: the runtime shards no stage with it, so no command prices
    or runs it (ZeRO-1 or replicated weights do run under PP)."""
    if pp > 1 and sharding is Sharding.FSDP:
        raise ValueError(f"FSDP2 does not run under pipeline parallelism (PP {pp}): use zero1 or replicated")
