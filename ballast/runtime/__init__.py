"""Executes plans for real with torch.distributed: cached groups, Ulysses attention, remapping,
FSDP2, the step loop."""
from .attention import StreamShard, parallelize, sequence_parallel_attention, shard_sizes
from .executor import (Executor, MicroBatchRecord, StepResult, WaveTiming, broadcast_plan,
                       make_optimizer)
from .fsdp import full_tensor, is_sharded, shard_model
from .groups import ProcessGroups
from .launch import init_distributed, run_local, under_torchrun
from .memory import ActivationMeter

__all__ = ["ActivationMeter", "Executor", "MicroBatchRecord", "ProcessGroups", "StepResult",
           "StreamShard", "WaveTiming", "broadcast_plan", "full_tensor", "init_distributed", "is_sharded",
           "make_optimizer", "parallelize", "run_local", "sequence_parallel_attention", "shard_model",
           "shard_sizes", "under_torchrun"]
