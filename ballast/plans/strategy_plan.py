"""StrategyPlan: the plan of a step under a heterogeneous strategy (docs/design.md, section 3,
*Strategies*): which pipeline trains which sequences, and each pipeline's own `Plan` over its pool.

    StrategyPlan -> the strategy (`vocabulary/strategy.py`): pipelines side by side, own (t, p)
                 -> one Plan per pipeline, over its pool's ranks, at its t and p
                 -> ids: the batch's sequence id of every sequence of each part

Each part is a whole `Plan` of its own sequences (its waves, groups and micro-batches, its memory
at its pipeline's (t, p) and the canonical layout's states), with the whole batch's loss
normaliser, so the parts' gradients add up to the batch's. A homogeneous mesh is the strategy of
one pipeline, its plan the one part holding every sequence.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Sequence

from ..pricing.cost import CostModel
from ..vocabulary.cluster import Cluster
from ..vocabulary.strategy import Strategy
from .plan import Plan, PlanError


@dataclass
class StrategyPlan:
    strategy: Strategy
    parts: list[Plan]
    """Pipeline i's plan, over its pool, at its t and p, of the sequences `ids[i]`."""
    ids: list[list[int]]
    """ids[i][j]: the batch's id (an index into `lengths`) of part i's sequence j."""
    lengths: list[int]
    """Tokens of every sequence of the global batch."""
    tokens: int = -1
    """Loss tokens of the whole batch, every part's normaliser; defaults to sum(lengths)."""
    planner: str = ""
    info: dict = field(default_factory=dict)
    """Planner-specific facts (the assignment's objective, the layouts it tried, ...)."""

    def __post_init__(self) -> None:
        self.lengths = [int(n) for n in self.lengths]
        if self.tokens < 0:
            self.tokens = sum(self.lengths)
        if not len(self.parts) == len(self.ids) == len(self.strategy.pipelines):
            raise PlanError(f"strategy {self.strategy} has {len(self.strategy.pipelines)} pipelines, but the plan "
                            f"gives {len(self.parts)} parts and {len(self.ids)} id lists")

    @classmethod
    def of_plan(cls, strategy: Strategy, plan: Plan) -> StrategyPlan:
        """The plan of a one-pipeline strategy: `plan` itself, every sequence its own."""
        assert len(strategy.pipelines) == 1, strategy
        return cls(strategy, [plan], [list(range(len(plan.lengths)))], list(plan.lengths), plan.tokens, plan.planner)

    def where(self, index: int) -> str:
        """Pipeline `index` as error messages name it."""
        ranks = self.strategy.ranks(index)
        return f"pipeline {index} {self.strategy.pipelines[index].label} (ranks {ranks.start}..{ranks.stop - 1})"

    # --- invariants ---------------------------------------------------------------------------
    def validate(self, cluster: Cluster, costs: Sequence[CostModel] | None = None) -> None:
        """PlanError unless the strategy covers `cluster` (`Strategy.check`), the parts partition
        the batch, and every part is a valid plan over its pipeline's pool at its (t, p)
        (`Plan.validate` with `costs[i]`, the pipeline's cost model: `strategy_cost_models`), its
        sequences the batch's and its normaliser the batch's."""
        try:
            self.strategy.check(cluster)
        except ValueError as error:
            raise PlanError(str(error)) from None
        if costs is not None and len(costs) != len(self.parts):
            raise PlanError(f"{len(costs)} cost models for the {len(self.parts)} pipelines of strategy {self.strategy}")
        owner: dict[int, int] = {}
        for i, ids in enumerate(self.ids):
            for j in ids:
                if not 0 <= j < len(self.lengths):
                    raise PlanError(f"{self.where(i)}: sequence {j} is not in the batch of {len(self.lengths)}")
                if j in owner:
                    raise PlanError(f"sequence {j} is in {self.where(owner[j])} and in {self.where(i)}")
                owner[j] = i
        if missing := [j for j in range(len(self.lengths)) if j not in owner]:
            raise PlanError(f"sequence {missing[0]} ({self.lengths[missing[0]]} tokens) is in no pipeline"
                            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        for i, (part, layout) in enumerate(zip(self.parts, self.strategy.pipelines)):
            if part.lengths != [self.lengths[j] for j in self.ids[i]]:
                raise PlanError(f"{self.where(i)}: its plan's lengths are not those of its sequences {self.ids[i][:8]}")
            if part.tokens != self.tokens:
                raise PlanError(f"{self.where(i)}: its plan normalises the loss by {part.tokens} tokens, the batch "
                                f"has {self.tokens}")
            if (part.tp, part.pp) != (layout.tp, layout.pp):
                raise PlanError(f"{self.where(i)}: its plan was made for TP {part.tp} x PP {part.pp}")
            block = self.strategy.block_cluster(i, cluster)
            try:
                part.validate(self.strategy.mesh(i, cluster).pool_cluster(block), None if costs is None else costs[i])
            except PlanError as error:
                raise PlanError(f"{self.where(i)}: {error}") from None

    # --- plain data ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"planner": self.planner, "tokens": self.tokens, "lengths": self.lengths, "info": self.info,
                "strategy": self.strategy.to_list(), "ids": [list(ids) for ids in self.ids],
                "parts": [part.to_dict() for part in self.parts]}

    @classmethod
    def from_dict(cls, data: dict) -> StrategyPlan:
        try:
            return cls(Strategy.from_list(data["strategy"]), [Plan.from_dict(part) for part in data["parts"]],
                       [[int(j) for j in ids] for ids in data["ids"]], list(data["lengths"]), int(data["tokens"]),
                       str(data.get("planner", "")), dict(data.get("info", {})))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, PlanError):
                raise
            raise PlanError(f"malformed strategy plan data: missing or wrong field {e}") from e

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> StrategyPlan:
        return cls.from_dict(json.loads(text))

    def table(self, max_rows: int = 40) -> str:
        """Each pipeline's sequences and its plan's table."""
        head = (f"plan by {self.planner or '?'} under strategy {self.strategy}: {len(self.lengths)} sequences, "
                f"{self.tokens} tokens")
        rows = [head]
        for i, part in enumerate(self.parts):
            held = part.lengths
            rows.append(f"{self.where(i)}: {len(held)} sequences, {sum(held)} tokens"
                        + (f", longest {max(held)}" if held else ", idle"))
            rows.extend("    " + line for line in part.table(max_rows).splitlines()[1:] if held)
        return "\n".join(rows)
