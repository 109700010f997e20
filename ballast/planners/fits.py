"""A batch no plan can hold, told as what the user can change: the options (--max-len,
--device-memory-gb, --cp), the job's ranks, a profile's degrees or a planner that runs context
parallelism. Pricing says which sample does not fit and why (`pricing/fits.py`); this side
knows the commands' options."""
from __future__ import annotations

from typing import Sequence

from ..pricing import fits
from ..pricing.cost import CostModel
from ..vocabulary.samples import Sample


def check_fits(cost: CostModel, samples: Sequence[Sample]) -> None:
    """Raise InfeasibleError naming the first sample no plan can hold and what would let it fit."""
    fits.check_fits(cost, samples, remedy)


def remedy(cost: CostModel, unfit: fits.Unfit) -> str:
    """What would let `unfit` fit, naming the options."""
    if unfit.kind == "window":
        return f"lower --max-len to {unfit.limit}"
    if unfit.kind == "positions":
        return (f"lower --max-len to {unfit.limit}, or raise max_position_embeddings in its config.json (with a "
                f"RoPE scaling where it needs one)")
    return f"lower --max-len, or give each device more memory (--device-memory-gb){degree_lever(cost)}"


def degree_lever(cost: CostModel) -> str:
    """What would allow an SP degree above the largest usable one: more ranks only where the
    heads (and a profile's measured degrees) allow the next one."""
    top, catalogue = cost.degrees[-1], cost.catalogue
    if 2 * top > catalogue.world_size:
        return " or the job more ranks"
    if 2 * top not in catalogue.exchange_degrees:
        return f"; the cost profile measured no SP degree above {top} (profile more ranks)"
    if not catalogue.rule.context:
        return (f"; SP degree {2 * top} needs context parallelism "
                f"({catalogue.layout.why_not(2 * top, catalogue.heads)}): use a planner that runs it "
                f"(ballast, megatron-dynamic-cp, zeppelin, wlb-llm) or static with --cp")
    return f"; no split of SP degree {2 * top} is allowed under {catalogue.rule.name}"
