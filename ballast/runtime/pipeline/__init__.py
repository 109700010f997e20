"""Pipeline parallelism for variable-length micro-batches (docs/design.md, section 7).

    config.py    PipelineConfig: p stages, each a pool of ranks that runs every step's plan
    split.py     a built model cut to this rank's stage (its blocks, the embedding first, the
                 head and loss last), torchtitan's way
    p2p.py       activations and gradients between neighbouring stages (batch_isend_irecv)
    executor.py  PipelineExecutor: a plan's micro-batches in 1F1B order over the stages
"""
from .config import PipelineConfig
from .executor import PipelineExecutor, pipeline_slots
from .split import split_model

__all__ = ["PipelineConfig", "PipelineExecutor", "pipeline_slots", "split_model"]
