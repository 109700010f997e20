"""What `ballast profile` adds for context parallelism (CP): the splits a model profiles, the CP
bytes the cost model charges them, the fit's residuals per point kind, and the planners
`--check` takes CP plans from (static USP besides the adaptive planners)."""
from __future__ import annotations

from dataclasses import dataclass

from ..vocabulary.layouts import ANY_SPLIT
from ..vocabulary.model_shape import ModelShape
from ..plans.plan import Plan
from .residuals import error_summary, time_and_act_errors


def context_splits(shape: ModelShape, world_size: int) -> list[tuple[int, int]]:
    """(degree, cp) of every split with a CP part that the runtime can run for this model on
    this world: text models (the profile's grid draws CP points from text streams; a video
    model's CP terms stay the analytic ones), every power-of-two degree up to the world, every CP
    part whose Ulysses part the heads allow."""
    if shape.pattern.clips:
        return []
    degrees = [1 << i for i in range(1, world_size.bit_length()) if (1 << i) <= world_size]
    return [(d, c) for d in degrees for c in ANY_SPLIT.context_parts(d, shape.heads, shape.pattern.layout)
            if c > 1]


def gathered_values_per_token_layer(shape: ModelShape, degree: int, cp: int) -> float:
    """K and V values a token brings each rank of a group of `degree` split `cp` ways, per block
    (`CostModel.gathered_per_token`): its Ulysses sub-group's share of the kv heads, replicated
    to lcm(kv, u) where u does not divide them."""
    u = degree // cp
    return 2 * shape.pattern.layout.exchanged_kv_heads(shape.kv_heads, u) * shape.head_dim / u


def context_bytes_per_token_layer(shape: ModelShape, value_bytes: int, degree: int, cp: int) -> float:
    """The CP bytes per token and block the cost model charges a (degree, cp) split: the
    gathered K, V forward and their gradients backward, (c - 1) / c of them from other ranks."""
    return 2.0 * gathered_values_per_token_layer(shape, degree, cp) * value_bytes * (cp - 1) / cp


def point_kind(row: dict) -> str:
    """A prediction row's kind, for residuals per term: Ulysses alone (or one rank), CP alone
    (u = 1), or the hybrid; with recomputation or without (the recomputation factors and the
    repeated exchanges); packed streams apart (their per-document work is what a CP factor
    fitted on single sequences may miss), those of MANY_SPANS samples or more apart again (the
    span term's points); remap points (`grid.Point.remap`) apart, whatever they hold."""
    cp, degree, samples = row.get("cp", 1), row["degree"], len(row["lengths"])
    if row.get("remap"):
        return "remap"
    split = "ulysses" if cp == 1 else "cp" if cp == degree else "hybrid"
    packed = " many spans" if samples >= MANY_SPANS else " packed" if samples > 1 else ""
    return f"{split}{' recomp' if row['recompute_layers'] else ''}{packed}"


MANY_SPANS = 16
"""Samples of a micro-batch from which its residual counts as the span term's (`point_kind`)."""


def residuals_by_kind(rows: list[dict]) -> dict:
    """Time and activation errors per point kind (`point_kind`), and the CP collectives' seconds
    as timed inside the runtime next to what the cost model prices for them (their bytes at the
    degree's bandwidth plus the CP latency, which also holds the sharding work around them)."""
    kinds = sorted({point_kind(row) for row in rows})
    out = {kind: time_and_act_errors([row for row in rows if point_kind(row) == kind]) for kind in kinds}
    context = [row for row in rows if row.get("cp", 1) > 1]
    if context:
        out["context_collectives"] = error_summary([row["context_priced_s"] / row["context_s"] - 1.0
                                                    for row in context if row["context_s"] > 0])
    return out


@dataclass(frozen=True)
class CheckedPlanner:
    """A planner the check takes plans from, with the static USP layout it is forced to (`cp`)."""

    name: str
    cp: int | None = None
    degree: int | None = None

    @property
    def label(self) -> str:
        return self.name if self.cp is None else f"{self.name} {self.degree // self.cp}x{self.cp}cp"


def checked_planners(names: list[str], shape: ModelShape, world_size: int) -> list[CheckedPlanner]:
    """The planners `names`, and where the model can run context parallelism on this world and
    `static` is among them, static USP with the world's widest CP part too (`PlannerOptions.cp`),
    so that the check measures CP groups even where no adaptive planner chooses one."""
    out = [CheckedPlanner(name) for name in names]
    splits = context_splits(shape, world_size)
    if "static" in names and splits:
        degree, cp = max(splits)
        out.append(CheckedPlanner("static", cp=cp, degree=degree))
    return out


def splits_used(plan: Plan) -> list[str]:
    """The (Ulysses x CP) splits of the plan's groups that run micro-batches, as u x c."""
    used = {(g.ulysses, g.cp) for _, g, mb in plan.micro_batches() if mb.seq_ids}
    return [f"{u}x{c}" for u, c in sorted(used)]


def runs_context(row: dict) -> bool:
    """Whether a compared plan ran a group with a CP part."""
    return any(not split.endswith("x1") for split in row["splits"])
