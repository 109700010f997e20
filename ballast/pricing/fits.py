"""Whether a batch's samples can be held at all: each within the model's attention window and
positions, and within one micro-batch at the largest degree with every layer recomputed.

`check_fits` names the first sample that cannot and why; what a user could change (flags,
ranks, planners) is the caller's to add (`remedy`): the planners' and commands' side
(`planners/fits.py`) knows the options, pricing does not.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..vocabulary.samples import Sample, tokens as sample_tokens
from .coefficients import InfeasibleError
from .cost import CostModel


@dataclass(frozen=True)
class Unfit:
    """A sample no plan can hold."""

    index: int
    """Its position in the batch."""
    tokens: int
    limit: int
    """The most tokens the binding limit allows."""
    kind: str
    """Which limit binds: "window" (sliding-window attention), "positions" (the model's position
    embeddings) or "memory" (one micro-batch at the largest degree, full recomputation)."""
    description: str
    """What is wrong, in a sentence naming the sample, its tokens and the limit."""


def first_unfit(cost: CostModel, samples: Sequence[Sample]) -> Unfit | None:
    """The first sample of `samples` that no plan under `cost` can hold, or None."""
    top = cost.degrees[-1]
    limit = cost.max_tokens(top, 1.0)
    window, positions = cost.attention_window, cost.max_positions
    for i, s in enumerate(map(sample_tokens, samples)):
        said = f"sequence {i} has {s} tokens, more than"
        if window is not None and s > window:
            return Unfit(i, s, window, "window", f"{said} model {cost.model!r}'s sliding-window attention covers "
                                                 f"({window}): ballast attends over whole sequences")
        if positions is not None and s > positions:
            return Unfit(i, s, positions, "positions",
                         f"{said} model {cost.model!r}'s positions cover (max_position_embeddings {positions}): "
                         f"its last tokens would train at positions the model was not made for")
        if s > limit:
            return Unfit(i, s, limit, "memory",
                         f"{said} any plan can hold: at most {limit} tokens fit one micro-batch (SP degree {top}, "
                         f"full recomputation, {cost.device_memory / 1e9:.3g} GB per device)")
    return None


def check_fits(cost: CostModel, samples: Sequence[Sample],
               remedy: Callable[[CostModel, Unfit], str] | None = None) -> None:
    """Raise InfeasibleError naming the first sample no plan can hold, followed by `remedy`'s
    advice for it where given."""
    unfit = first_unfit(cost, samples)
    if unfit is not None:
        raise InfeasibleError(unfit.description + (f"; {remedy(cost, unfit)}" if remedy else ""))
