"""Executes plans for real with torch.distributed.

    parallelize.py  the one entry point: model + cluster (+ job mesh) -> Executor (SP attention,
                    the model cut into PP stages and split over TP groups, FSDP2 or replicated
                    weights, AdamW with ZeRO-1 or not)
    executor.py     Executor.step: a plan's waves, micro-batches, recomputation, loss, grad sync
    broadcast.py    rank 0's plan (and the batch's tokens) on every rank
    attention.py    Ulysses attention over a packed stream sharded across a group
    context_shard.py, context_parallel.py  context-parallel (CP) attention: head-tail chunks,
                    K/V all-gathered, dK/dV reduce-scattered
    hybrid.py       Ulysses x CP (USP's 2D layout): the stream class of groups with a CP part
    remap.py        Zeppelin's remapping layer: linear work on a balanced layout
    video_sp.py     2D sequence parallelism of video DiTs: whole frames / patch columns per rank
    all_to_all.py   the one all-to-all autograd function all of them exchange through
    routing.py      Zeppelin's routing layer: an exchange over whole nodes whose inter-node rows
                    cross over every NIC of the node (scatter to proxies, rails, combine)
    shard_sizes.py  the one even contiguous cut of rows over ranks
    grad_sync.py    the gradient sync of replicated weights: buckets reduced during the last backward
    fsdp.py         FSDP2 sharding of the model
    groups.py       cached process groups of every aligned power-of-two block and its (u, c) splits
    world.py        joining the job: torchrun, or N local gloo ranks
    job.py          a command's ranks: local gloo ranks, or torchrun's (rank 0 runs the command,
                    the others serve its distributed calls)
    host_memory.py  a CPU rank's malloc keeps freed memory, as CUDA's caching allocator does
    memory.py       bytes saved for backward, measured
    tensor_parallel/  tensor parallelism: every layer split over the job mesh's TP groups
    pipeline/       pipeline parallelism: the job mesh's p stages, a plan's micro-batches run
                    through them in 1F1B
"""
from .attention import StreamShard, sequence_parallel_attention
from .broadcast import broadcast_plan
from .executor import Executor
from .step_result import MicroBatchRecord, StepResult, WaveTiming
from .fsdp import full_tensor, is_sharded, shard_model
from .groups import ProcessGroups
from .memory import ActivationMeter
from .build_turns import ModelBuild
from .parallelize import make_optimizer, parallelize
from .shard_sizes import shard_sizes
from .video_sp import BALANCE, Relayout, TokenSplit, VideoLayouts, VideoShard, video_layouts
from .job import describe_ranks, in_job, job_backend, job_world, on_ranks
from .world import PeerFailed, RankFailed, RankInputError, init_distributed, rank_device, run_local, under_torchrun

__all__ = ["ActivationMeter", "BALANCE", "Executor", "MicroBatchRecord", "PeerFailed", "ProcessGroups",
           "RankFailed", "RankInputError", "Relayout", "StepResult",
           "StreamShard", "TokenSplit", "VideoLayouts", "VideoShard", "WaveTiming", "broadcast_plan", "describe_ranks",
           "full_tensor", "in_job", "init_distributed", "is_sharded", "job_backend", "job_world", "make_optimizer",
           "ModelBuild", "on_ranks", "parallelize", "rank_device", "run_local",
           "sequence_parallel_attention", "shard_model", "shard_sizes", "under_torchrun", "video_layouts"]
