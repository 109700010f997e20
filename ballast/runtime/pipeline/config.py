"""Where a pipeline's stages sit among the job's ranks: p stages, each a pool of ranks.

    global rank = stage * pool + pool rank

The pool is what a step's plan lays out (its ranks 0..pool-1, its Ulysses x CP groups and
waves); every stage runs the same plan on its own pool, so a micro-batch's group is the same
pool ranks at every stage, and pool rank r's pipeline is the ranks r, pool + r, 2 pool + r, ...
(the pipeline dimension outermost, as torchtitan's and Megatron's meshes put it).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...vocabulary.model_shape import ModelShape
from ...vocabulary.pipeline_schedule import check_pipeline_shape, stage_layers


@dataclass(frozen=True)
class PipelineConfig:
    """A job's pipeline: its stage count and the ranks of each stage's pool."""

    stages: int
    """p: the pipeline's stages (1: no pipeline)."""
    pool: int
    """Ranks per stage: the world of every step's plan."""

    def __post_init__(self) -> None:
        if self.stages < 1 or self.pool < 1:
            raise ValueError(f"a pipeline needs at least one stage of at least one rank, got {self.stages} "
                             f"stage(s) of {self.pool} rank(s)")

    @classmethod
    def of_world(cls, world: int, stages: int) -> PipelineConfig:
        """`stages` stages over a job of `world` ranks; ValueError unless they divide it."""
        if stages < 1 or world % stages:
            raise ValueError(f"--pp {stages} does not divide the {world} ranks (--world): every pipeline stage "
                             f"holds as many")
        return cls(stages, world // stages)

    @property
    def world(self) -> int:
        return self.stages * self.pool

    def check(self, world: int, shape: ModelShape) -> None:
        """ValueError unless the pipeline covers a job of `world` ranks and can cut a model of
        `shape` into its stages (`check_pipeline_shape`)."""
        if world != self.world:
            raise ValueError(f"{self.stages} pipeline stage(s) of {self.pool} rank(s) need {self.world} ranks, "
                             f"the job has {world}")
        check_pipeline_shape(shape, self.stages)

    def stage_of(self, rank: int) -> int:
        return rank // self.pool

    def rank(self, stage: int, pool_rank: int) -> int:
        """The global rank of pool rank `pool_rank` of stage `stage`."""
        assert 0 <= stage < self.stages and 0 <= pool_rank < self.pool, (stage, pool_rank)
        return stage * self.pool + pool_rank

    def pools(self) -> list[list[int]]:
        """Every stage's ranks, stage by stage (`ProcessGroups`' pools)."""
        return [[self.rank(s, r) for r in range(self.pool)] for s in range(self.stages)]

    def layers(self, stage: int, layers: int) -> range:
        """The blocks stage `stage` holds of a model of `layers` blocks."""
        return stage_layers(stage, self.stages, layers)
