"""A model cut to one pipeline stage after it is built (torchtitan's `pipeline_module_split`):
the model, built alike on every rank, drops what its stage does not hold."""
from __future__ import annotations

from ...models.protocol import ParallelModel, StagedModel
from ...vocabulary.job_mesh import JobMesh


def split_model(model: ParallelModel, mesh: JobMesh, stage: int) -> None:
    """Keep stage `stage`'s part of `model` (its equal run of blocks, the embedding on the first
    stage, the final norm, output layer and loss on the last); ValueError for a model that
    cannot be cut into stages."""
    if not isinstance(model, StagedModel):
        raise ValueError(f"model {model.shape.name!r} cannot be cut into pipeline stages (text models can): "
                         f"run it without --pp")
    model.keep_stage(mesh.stage_layers(stage, model.shape.layers), stage == 0, stage == mesh.pp - 1)
