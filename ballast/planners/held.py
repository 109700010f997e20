"""Samples a planner leaves to a later step (WLB-LLM's outlier delay), carried across steps.

A planner may name samples of a step that should train in a later one instead (`Planner.defer`):
WLB-LLM queues its longest documents until enough of them have gathered to give every
micro-batch one, so no step's pipeline stalls behind a single outlier. `DeferredSamples` is the
queue the trainer and `ballast simulate` keep for it. Each step's candidates are the held samples,
in the order they were drawn, then the step's fresh draw; the planner names the ones to hold; the
others are the step's batch, and every one of them trains in that step, once.

What keeps a sample from waiting forever, and training from losing one:
- a sample waits at most `MAX_WAIT` steps, then trains whatever the planner says;
- nothing is held past a final step: the trainer's last batch of an epoch (so an epoch's samples
  train within it, and the history still lists every sample of an epoch once) and simulate's last
  step (so every planner of a table trains the same samples);
- the held samples are part of the data position: the trainer saves their ids, and how long each
  has waited, with the stream's position (`state_dict`), so a resumed run draws and holds exactly
  what the uninterrupted one would.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Hashable, Sequence, TypeVar

from ..vocabulary.samples import Sample

if TYPE_CHECKING:
    from .base import Planner

Key = TypeVar("Key", bound=Hashable)

MAX_WAIT = 8
"""Steps a sample may wait at most. Ours: WLB-LLM bounds the wait only by its queues filling;
a bound keeps a rare outlier from training hundreds of steps after it was drawn (and its data
position from growing without end) when its queue level seldom fills."""


class DeferredSamples(Generic[Key]):
    """The samples held for later steps, each as (key, planned sample, steps waited): the key is
    what the caller draws a sample by (a sample id for the trainer, the sample for simulate)."""

    def __init__(self) -> None:
        self.held: list[tuple[Key, Sample, int]] = []

    def admit(self, fresh: Sequence[tuple[Key, Sample]], planner: Planner, final: bool) -> list[Key]:
        """The keys of this step's batch, in candidate order (held first, then `fresh`); the rest
        are held. `final`: hold nothing."""
        candidates = [(key, sample, waited) for key, sample, waited in self.held] + \
                     [(key, sample, 0) for key, sample in fresh]
        # The queue is the planner's; the bound on waiting is kept here, for every planner alike.
        wanted = set() if final else set(planner.defer([s for _, s, _ in candidates]))
        assert wanted <= set(range(len(candidates))), f"{planner.name} deferred an index out of its candidates"
        hold = {i for i in wanted if candidates[i][2] < MAX_WAIT}
        if len(hold) == len(candidates):  # a step trains something: then it trains them all
            hold = set()
        self.held = [(key, sample, waited + 1) for i, (key, sample, waited) in enumerate(candidates) if i in hold]
        return [key for i, (key, _, _) in enumerate(candidates) if i not in hold]

    def __len__(self) -> int:
        return len(self.held)

    def state_dict(self) -> dict:
        """The held keys and waits, JSON-serialisable when the keys are."""
        return {"keys": [key for key, _, _ in self.held], "waited": [w for _, _, w in self.held]}

    def load_state_dict(self, state: dict, samples: Sequence[Sample]) -> None:
        """Hold `state`'s keys again, whose planned samples the caller looked up (`samples`, in
        `state["keys"]` order); ValueError for a state that is not one."""
        keys, waited = state.get("keys"), state.get("waited")
        if not (isinstance(keys, list) and isinstance(waited, list) and len(keys) == len(waited) == len(samples)
                and all(isinstance(w, int) and 0 < w <= MAX_WAIT for w in waited)):
            raise ValueError(f"held samples' state must give as many keys as waits (each 1..{MAX_WAIT}), got {state!r}")
        self.held = list(zip(keys, samples, waited))
