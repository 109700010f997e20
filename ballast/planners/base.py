"""The planner interface: a Planner turns the samples of one global batch into a Plan."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Sequence

from ..vocabulary.cluster import Cluster
from ..pricing.cost import CostModel
from ..vocabulary.layouts import ULYSSES_ONLY, Splits
from ..plans.plan import Plan
from ..plans.timeline import whole_step_time
from ..vocabulary.samples import SampleBatch, Sample
from .fits import check_fits
from .packing import fixed_recompute


def _read_by(flag: str, *planners: str) -> dict[str, Any]:
    """A field's metadata: the flag that sets it and the only planners that read it."""
    return {"flag": flag, "read_by": planners}


@dataclass(frozen=True)
class PlannerOptions:
    """Settings shared by all planners; each planner reads the ones it understands (a field read
    by some planners only names them, `read_by`, so that `check_read` refuses it for others).
    The one value every command hands its planners (built from its flags; the bench setting
    holds one), with the defaults below; `SHORT_SOLVES` is the one departure from them."""

    max_len: int | None = None
    """Longest sequence the run allows; fixed-layout planners size their SP degree for it.
    None: the longest sequence of each batch."""
    degree: int | None = field(default=None, metadata=_read_by("--degree", "static", "bucket", "wlb-llm"))
    """Force the SP degree of fixed-degree planners (`static`, `bucket`, `wlb-llm`)."""
    cp: int | None = field(default=None, metadata=_read_by("--cp", "static"))
    """`static`: the context-parallel part of its degree (static USP: `degree` = Ulysses x `cp`);
    None: Ulysses alone."""
    seed: int = 0
    """Seed of randomised planners (Hydraulis' shuffles)."""
    time_limit: float = field(default=10.0, metadata=_read_by("--time-limit", "flexsp"))
    """Wall-clock seconds per MILP solve (`flexsp`)."""
    buckets: int = field(default=16, metadata=_read_by("--buckets", "flexsp"))
    """Length buckets of FlexSP's DP bucketing."""
    dcp_mode: str = field(default="both", metadata=_read_by("--dcp-mode", "dcp"))
    """`inter`, `intra` or `both`: which of DCP's two optimisations `dcp` applies."""
    remap: bool = field(default=True, metadata=_read_by("--zeppelin-remap", "zeppelin"))
    """`zeppelin`: model the remapping layer that balances linear-module tokens over a wave."""
    routing: bool = field(default=True, metadata=_read_by("--routing", "zeppelin", "ballast"))
    """Route inter-node all-to-alls over every NIC of the node (Zeppelin's routing layer,
    `Wave.routed`) where the planner's rule says so: `zeppelin` in every wave with one, as its
    paper does; `ballast` in the waves it makes faster. Other planners never route. False: none."""
    defer_outliers: bool = field(default=True, metadata=_read_by("--defer-outliers", "wlb-llm", "ballast"))
    """Let outliers wait for later steps in WLB-LLM's queue (`outliers.py`, `held.py`): `wlb-llm`
    as its paper does, `ballast` under a pipeline, where it measured faster (its `defer`). Then
    they train some samples a few steps after they were drawn, so their loss curve is not the
    other planners'; False: every sample trains in the step that drew it."""
    lockstep: bool = False
    """Emit lockstep plans (FSDP/ZeRO-3): equal micro-batch counts per group in every wave.
    Planners that are lockstep by nature (`static`, `batch-adaptive`, `bucket`) always are."""

    def check_read(self, planners: Sequence[str], unset: PlannerOptions) -> None:
        """ValueError naming the flag and the planners it applies to when a setting that differs
        from the command's `unset` one is read by none of `planners`: it would change nothing."""
        for f in fields(self):
            readers = f.metadata.get("read_by")
            value = getattr(self, f.name)
            if readers is None or value == getattr(unset, f.name) or set(readers) & set(planners):
                continue
            given = f"{f.metadata['flag']} {value}" if not isinstance(value, bool) else \
                f"--{'' if value else 'no-'}{f.metadata['flag'][2:]}"
            which = f"planner {planners[0]}" if len(planners) == 1 else f"planners {', '.join(planners)}"
            raise ValueError(f"{given} applies to {', '.join(readers)} only: the {which} would ignore it")


SHORT_SOLVES = PlannerOptions(time_limit=2.0)
"""The defaults of the commands that plan beside the ranks they measure (train, bench, the
profile's check): flexsp's MILP gets 2 s per solve instead of 10. Train plans each step while the
one before it trains and bench plans between its measured steps, on the same CPU cores, so a
long solve slows or stalls the steps; the check measures the plans, not the solver. simulate and
verify plan with the defaults above."""


class StepPlanner:
    """What the training loop asks of whatever plans its steps (a `Planner`, or a strategy's
    `strategy_choice.StrategyChoice`) besides the plan and its predicted seconds: samples to hold
    for later steps, and state to checkpoint."""

    def defer(self, samples: Sequence[Sample]) -> list[int]:
        """Indices of `samples`, a step's candidates (those held from earlier steps first, in the
        order they were drawn; then the step's fresh draw), that
        should train in a later step (`held.DeferredSamples` keeps them and bounds their wait).
        None unless a planner says otherwise: most train every sample in the step it is drawn."""
        del samples
        return []

    def state_dict(self) -> dict:
        """Planner state to checkpoint (most planners are stateless)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        del state


class Planner(StepPlanner, ABC):
    """Plans one step at a time; may keep state across steps (saved with checkpoints)."""

    name: ClassVar[str]

    def __init__(self, cluster: Cluster, cost: CostModel, options: PlannerOptions | None = None):
        if cost.world_size != cluster.world_size:
            raise ValueError(f"cost model made for {cost.world_size} devices, cluster {cluster.name!r} "
                             f"has {cluster.world_size}")
        self.cluster = cluster
        self.options = options or PlannerOptions()
        self.cost = cost.under(self.splits())
        self._check_degree(self.options.degree)

    @property
    def pipelined(self) -> bool:
        """Whether the plans run through a pipeline of stages (`cost.stages`, PP p > 1): then no
        planner remaps or routes, since a stage runs neither remap domains nor routed exchanges
        (`runtime/pipeline`; the timeline would price what the runtime does not run)."""
        return self.cost.stages is not None

    def splits(self) -> Splits:
        """The (Ulysses x CP) splits of a degree this planner runs (`layouts.Splits`): Ulysses
        alone unless a planner says otherwise, so published rivals keep their behaviour."""
        return ULYSSES_ONLY

    def _check_degree(self, degree: int | None) -> None:
        """A forced degree must exist on this cluster and model, and hold `max_len`: known before
        any batch, so a run fails at its start (before ranks spawn), not at its first step."""
        if degree is None:
            return
        if degree not in self.cost.degrees:
            raise ValueError(f"SP degree {degree} is not usable by planner {self.name!r}: degrees are "
                             f"{self.cost.degrees} (powers of two up to the world size of "
                             f"{self.cluster.world_size} with a split of Ulysses dividing the model's heads "
                             f"x context parallelism that {self.cost.splits.name} allows)")
        if self.options.max_len is not None:
            fixed_recompute(self.cost, self.options.max_len, degree)

    def plan(self, samples: Sequence[Sample]) -> Plan:
        """The plan of one step for a batch of these samples: sequence lengths (text) or
        (frames, height, width) clips in latent patches, mixed freely."""
        if not len(samples):
            raise ValueError("cannot plan an empty batch")
        batch = SampleBatch.of(samples, self.cost)
        check_fits(self.cost, batch.lengths)
        plan = self._plan(batch)
        plan.planner = self.name
        # A plan over the pool of the mesh its cost model prices a rank of (TP shards, stages).
        plan.tp, plan.pp = (self.cost.mesh.tp, self.cost.mesh.pp) if self.cost.mesh is not None else (1, 1)
        # A planner that weighs the splits gave its groups theirs (ballast packs each at its
        # fastest); one that prices degrees alone priced them at `SplitCatalogue.split`, which they get.
        for _, group, _ in plan.micro_batches():
            if group.cp not in self.cost.catalogue.context_parts(group.degree):
                group.cp = self.cost.catalogue.split(group.degree)
        assert plan.shapes == batch.shapes, "a planner's plan must carry its batch's shapes"
        return plan

    @abstractmethod
    def _plan(self, batch: SampleBatch) -> Plan:
        """Plan a non-empty batch whose every sample fits some degree."""

    def predicted_seconds(self, plan: Plan) -> float:
        """The plan's whole step under the planner's cost model (`plans/timeline.whole_step_time`):
        its waves, the gradient sync left after them and the optimizer step."""
        return whole_step_time(plan, self.cost)

