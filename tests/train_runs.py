"""The short training runs the train tests spawn on 2 gloo ranks (text, Hugging Face, video)."""
from __future__ import annotations

from pathlib import Path

from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.cost_sources import analytic_cost
from ballast.vocabulary.model_shape import get_model_shape
from ballast.train.config import TrainConfig


def text_memory_gb(model: str, max_len: int) -> float:
    """Per-rank memory (of 2 CPU ranks) in which `max_len` tokens need SP degree 2 or
    recomputation (as `verify`)."""
    cost = analytic_cost(get_model_shape(model), get_cluster("cpu", world_size=2))
    return max(cost.states + cost.act_per_token * max_len / 2, 1.01 * cost.device.after_backward) / 1e9


def run_config(out: Path, steps: int, *, model: str, source: str, max_len: int, tokens_per_step: int,
               device_memory_gb: float, cache_dir: str | None = None, planner: str = "ballast",
               degree: int | None = None, decay_steps: int | None = None, timeout: float = 60.0,
               checkpoint_interval: int = 2, tp: int = 1, pp: int = 1, strategy: str | None = None,
               report: bool = False,
               **optimizer) -> TrainConfig:
    """`steps` steps of `model` on `source` written to `out`, after a 2-step warm-up, at TP degree
    `tp` and PP degree `pp` (or under the `strategy`s of --strategy), its report's plots drawn if `report` (they cost more than a few
    steps; the tests that read them ask for them); `optimizer` sets the optimizer's other fields (`zero1=True`,
    `fsdp=True`, `lr=...`)."""
    c = TrainConfig()
    c.model.model = model
    c.data.source, c.data.cache_dir = source, cache_dir
    c.data.max_len, c.data.tokens_per_step = max_len, tokens_per_step
    c.planner.planner, c.planner.device_memory_gb, c.planner.degree = planner, device_memory_gb, degree
    c.planner.tp, c.planner.pp, c.planner.strategy = tp, pp, strategy
    c.optimizer.warmup_steps, c.optimizer.decay_steps = 2, decay_steps
    for key, value in optimizer.items():
        setattr(c.optimizer, key, value)
    c.run.steps, c.run.out_dir, c.run.timeout, c.run.report = steps, str(out), timeout, report
    c.checkpoint.checkpoint_interval = checkpoint_interval
    return c
