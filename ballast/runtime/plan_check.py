"""What a rank checks of a step's plan and samples before any collective (`Executor.step`): every
rank holds the same plan and samples, so every rank raises the same ValueError and none waits
on a peer that refused."""
from __future__ import annotations

from typing import Any, Sequence

from ..models.protocol import ParallelModel
from ..plans.plan import Plan
from ..vocabulary.cluster import Cluster
from ..vocabulary.job_mesh import JobMesh


def check_plan(plan: Plan, samples: Sequence[Any], mesh: JobMesh, pool_cluster: Cluster, model: ParallelModel, *,
               routes: bool, lockstep_only: bool) -> None:
    """ValueError unless `plan` runs on `mesh` (its pool `pool_cluster`) with `model` on `samples`:
    made for the mesh's TP and PP degrees, valid on the pool, routed only where the job made
    routing groups (`routes`), every split one the model's heads allow under the mesh's TP, the
    samples the plan's in number and shape, and lockstep where the model is sharded with FSDP2
    (`lockstep_only`)."""
    if (plan.tp, plan.pp) != (mesh.tp, mesh.pp):
        raise ValueError(f"plan {plan.planner!r} was made for TP degree {plan.tp} and PP degree {plan.pp}; "
                         f"the job runs {mesh.describe()}")
    plan.validate(pool_cluster)
    for w, wave in enumerate(plan.waves):
        if wave.routed and not routes:
            raise ValueError(f"wave {w} of plan {plan.planner!r} is routed, but a job with tensor or pipeline "
                             f"parallelism makes no routing groups: plan it with --no-routing")
    for _, group, mb in plan.micro_batches():
        if mb.seq_ids and (why := mesh.split_why_not(model.shape, group.degree, group.cp)):
            raise ValueError(f"model {model.shape.name!r}: {why}")
    if len(samples) != len(plan.lengths):
        raise ValueError(f"the plan has {len(plan.lengths)} samples but {len(samples)} were given")
    for i, (sample, planned) in enumerate(zip(samples, plan.samples)):
        if (got := model.sample_shape(sample)) != planned:
            raise ValueError(f"sample {i} is {got} for the model (a text sample's trained tokens, a clip's "
                             f"latent patches); the plan has it as {planned}")
    if lockstep_only and not plan.lockstep:
        raise ValueError(f"a model sharded with FSDP runs lockstep plans only (every group of a wave "
                         f"runs as many micro-batches); plan {plan.planner!r} is not: make it with "
                         f"PlannerOptions(lockstep=True)")
