"""Rank 0's data and planning, one step ahead of training.

Rank 0 alone draws batches and plans them: the executor runs the plan rank 0 broadcasts, so
only one rank needs the corpus and only one spends CPU on planning. `Lookahead` does both for
step k + 1 in a background thread while step k trains, so a planner's latency is hidden
whenever it is shorter than a step (a slow one, say FlexSP's MILP, still shows as wait time).

Only the thread touches the stream and the planner once it has started, so neither needs a
lock. A checkpoint after step k must resume at step k + 1 while the thread may already have
drawn that batch, so every `StepInput` carries the stream's and planner's state right after
its own step was drawn and planned: the state to save with step k is step k's.

The thread shares rank 0's interpreter lock with the training loop. On a CPU rank the step's
kernels run inside the calls that launched them and release the lock, so planning only takes
cores. On a GPU the loop's work is launching kernels, each launch a short Python call that must
take the lock back: while the planner runs pure Python, each launch can wait up to the
interpreter's switch interval (`sys.getswitchinterval()`, 5 ms) for it, so rank 0 launches
slower while step k + 1 is planned, and the other ranks wait for rank 0 at the step's
collectives. Its cost is bounded by the planning time (not measured on a GPU here): a planner
that is fast next to a step (ballast, static, bucket) costs rank 0 at most its own seconds per
step; a slow one (FlexSP's MILP) should be measured with its plan time against the step's, or
run with --no-plan-ahead, which plans between steps instead.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..dataset import EpochStream, GlobalBatch
from ..plans.plan import Plan
from ..planners import Planner
from ..planners.held import DeferredSamples


@dataclass
class StepInput:
    """Everything rank 0 prepares for one step."""

    step: int
    batch: GlobalBatch
    plan: Plan
    plan_seconds: float
    """Wall-clock time the planner took for this batch."""
    predicted_seconds: float
    """The plan's whole step under the cost model (`ballast.plans.timeline.whole_step_time`): its
    waves, the gradient sync left after them and the optimizer step, as the measured step holds."""
    data_state: dict
    """Where step + 1 starts: the stream's `state_dict()` right after this batch, with the
    samples held for later steps under "held" (`load_data_state`)."""
    planner_state: dict
    """`Planner.state_dict()` right after planning this batch."""
    held: int
    """Samples drawn by this step or before that wait for a later one (`Planner.defer`)."""


def load_data_state(stream: EpochStream, held: DeferredSamples, state: dict) -> None:
    """Resume `stream` and `held` at a `StepInput.data_state` (one saved before samples could be
    held has none)."""
    stream.load_state_dict(state)
    saved = state.get("held", {"keys": [], "waited": []})
    keys = saved.get("keys") if isinstance(saved, dict) else None
    if not (isinstance(keys, list) and all(isinstance(k, int) and 0 <= k < stream.num_samples for k in keys)):
        raise ValueError(f"the data state's held samples must be sample ids of this stream "
                         f"(0..{stream.num_samples - 1}), got {saved!r}")
    held.load_state_dict(saved, stream.planned_samples(keys))


class Lookahead:
    """`get(k)` returns step k's input and starts preparing step k + 1 (while it is < `steps`)."""

    def __init__(self, stream: EpochStream, planner: Planner, held: DeferredSamples, steps: int, ahead: bool):
        self.stream, self.planner, self.held, self.steps = stream, planner, held, steps
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ballast-plan") if ahead else None
        self._next: Future[StepInput] | None = None

    def _prepare(self, step: int) -> StepInput:
        fresh, epoch = self.stream.next_ids()
        start = time.perf_counter()
        # Held samples are always of the stream's epoch: the epoch's last batch holds none.
        final = self.stream.epoch != epoch
        ids = self.held.admit(list(zip(fresh.tolist(), self.stream.planned_samples(fresh))), self.planner, final)
        batch = self.stream.make_batch(np.asarray(ids, dtype=np.int64), epoch)
        plan = self.planner.plan(batch.planned)
        seconds = time.perf_counter() - start
        data_state = {**self.stream.state_dict(), "held": self.held.state_dict()}
        return StepInput(step, batch, plan, seconds, self.planner.predicted_seconds(plan), data_state,
                         self.planner.state_dict(), len(self.held))

    def get(self, step: int) -> StepInput:
        if self._pool is None:
            return self._prepare(step)
        current = self._next.result() if self._next is not None else self._prepare(step)
        assert current.step == step, f"lookahead prepared step {current.step}, step {step} asked"
        self._next = self._pool.submit(self._prepare, step + 1) if step + 1 < self.steps else None
        return current

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
