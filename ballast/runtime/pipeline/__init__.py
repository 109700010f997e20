"""Pipeline parallelism for variable-length micro-batches (docs/design.md, section 7).

Where the stages sit among the job's ranks is the job's `JobMesh` (PP outermost: stage k holds
ranks k t pool .. (k + 1) t pool - 1; a rank's pipeline is the ranks of its pool and TP index,
one per stage, `JobMesh.pp_ranks`).

    split.py     a built model cut to this rank's stage (its blocks, the embedding first, the
                 head and loss last), torchtitan's way
    p2p.py       activations and gradients between neighbouring stages (batch_isend_irecv)
    executor.py  PipelineExecutor: a plan's micro-batches in 1F1B order over the stages
"""
from .executor import PipelineExecutor, pipeline_slots
from .split import split_model

__all__ = ["PipelineExecutor", "pipeline_slots", "split_model"]
