"""Training with context parallelism on 2 gloo ranks: static USP at (u, c) = (1, 2) and ballast
(which picks CP groups at this budget) end at the parameters static Ulysses at degree 2 ends at,
and a CP run resumed from its checkpoint repeats the uninterrupted one bit for bit.

Every run shards the model with FSDP2. The budget holds the longest sequence (MAX_LEN) only at SP
degree 2 fully recomputed, where context parallelism's exchange is the cheaper one, so ballast's
groups of degree 2 run CP. (Replicated, a rank holds 16 bytes a parameter and AdamW's
temporaries after backward: any budget it fits holds MAX_LEN tokens on one rank.)
Same seed and batches: every plan sums the same per-token gradients, in another order (CP
reduce-scatters dK and dV where Ulysses all-to-alls them back), so losses agree to float rounding
(LOSS_RTOL, as tests/train/test_run.py) and parameters up to that rounding as AdamW carries it:
Adam divides each coordinate's step by its own gradient's scale, so a coordinate whose gradient
is near zero turns a rounding difference into a step difference of up to the learning rate.
PARAM_ATOL bounds it: measured 2.6e-5 after 3 steps (peak lr 3e-3, 2 warm-up steps), where a
micro-batch lost or trained twice moves the parameters by the order of the learning rate.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from corpora import jsonl_corpus
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from train_runs import run_config

from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.cost_sources import get_cost_model
from ballast.vocabulary.precision import Precision
from ballast.vocabulary.sharding import Sharding
from ballast.dataset import build_corpus
from ballast.vocabulary.model_shape import get_model_shape
from ballast.runtime import run_local
from ballast.train.metrics import final_history

MAX_LEN = 256
BUDGET = 1024
STEPS = 3
PARAM_ATOL = 2e-4
LOSS_RTOL = 1e-5

pytestmark = pytest.mark.slow


def budget_gb() -> float:
    """Per-rank memory in which MAX_LEN tokens fit only at degree 2, every layer recomputed, CP included."""
    cost = get_cost_model("analytic", get_model_shape("tiny"), get_cluster("cpu", world_size=2),
                          sharding=Sharding.FSDP, precision=Precision.FP32)
    memory = cost.memory([MAX_LEN], 2, 1.0, 2) * 1.001
    assert cost.device.after_backward < memory < cost.memory([MAX_LEN], 1, 1.0, 1)
    return memory / 1e9


def _train_all(configs) -> None:
    from ballast.train.loop import train

    for c in configs:
        train(c)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cp-runs")
    source, cache = jsonl_corpus(root, documents=120, longest=2000, seed=1)
    build_corpus(source, cache_dir=cache, progress=False)  # tokenise once, before the ranks

    def config(name: str, steps: int, planner: str, degree: int | None = None, cp: int | None = None):
        c = run_config(root / name, steps, model="tiny", source=source, cache_dir=cache, max_len=MAX_LEN,
                       tokens_per_step=BUDGET, device_memory_gb=budget_gb(), planner=planner, degree=degree,
                       decay_steps=STEPS, checkpoint_interval=0, fsdp=True)
        c.planner.cp = cp
        return c

    configs = [config("ulysses", STEPS, "static", degree=2), config("usp", STEPS, "static", degree=2, cp=2),
               config("usp-split", 2, "static", degree=2, cp=2), config("usp-split", STEPS, "static", degree=2, cp=2),
               config("ballast", STEPS, "ballast")]
    run_local(2, _train_all, configs, timeout=600)
    return {name: root / name for name in ("ulysses", "usp", "usp-split", "ballast")}


def parameters(out: Path) -> dict[str, torch.Tensor]:
    newest = sorted((out / "checkpoints").iterdir())[-1]
    dcp_to_torch_save(newest, out / "final.pt")
    return torch.load(out / "final.pt", weights_only=False)["model"]


def history(out: Path) -> list[dict]:
    return final_history(out / "metrics.jsonl")


def test_static_usp_and_ballast_end_at_ulysses_parameters(runs):
    reference = parameters(runs["ulysses"])
    assert all(r["context_parts"] == [1] for r in history(runs["ulysses"]))
    assert all(r["context_parts"] == [2] for r in history(runs["usp"]))
    assert any(2 in r["context_parts"] for r in history(runs["ballast"])), \
        "ballast ran no CP group: the test would not cover its splits"
    for run in ("usp", "ballast"):
        assert [r["sample_ids"] for r in history(runs[run])] == [r["sample_ids"] for r in history(runs["ulysses"])]
        losses = [(a["loss"], b["loss"]) for a, b in zip(history(runs[run]), history(runs["ulysses"]))]
        assert all(abs(a - b) <= LOSS_RTOL * b for a, b in losses)
        theirs = parameters(runs[run])
        assert theirs.keys() == reference.keys()
        worst = max(float((theirs[k] - reference[k]).abs().max()) for k in reference)
        print(f"{run}: largest parameter difference from static Ulysses after {STEPS} steps: {worst:.2e}")
        assert worst <= PARAM_ATOL
    moved = max(float((reference[k] - parameters(runs["usp-split"])[k]).abs().max()) for k in reference)
    assert moved <= PARAM_ATOL


def test_a_resumed_cp_run_repeats_the_uninterrupted_one(runs):
    whole, split = history(runs["usp"]), history(runs["usp-split"])
    assert len(whole) == STEPS and [r["loss"] for r in split] == [r["loss"] for r in whole]  # bit for bit
    assert len((runs["usp-split"] / "metrics.jsonl").read_text().splitlines()) == STEPS, \
        "the resumed run re-ran no step: it started after the 2-step checkpoint"
    final = [parameters(runs[run]) for run in ("usp", "usp-split")]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])
