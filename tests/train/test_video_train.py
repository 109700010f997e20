"""`ballast train` of a video DiT for real on 2 gloo ranks: `stdit-tiny` on `video-synthetic`.

One spawn trains under FSDP2: 3 steps with the `ballast` planner; 2 steps then a resume to 3; 3
steps with `static` (one SP degree for every clip, as VideoSys / Open-Sora users run it); then the
same 3 `ballast` steps replicated and with ZeRO-1, each at its own mode's budget; and `dit-tiny`
for 2 steps. FSDP2's budget makes the largest clips need SP degree 2 even fully recomputed (its
states leave room for 307 latent patches a rank, `ballast verify`'s budget), so `ballast` mixes
degrees and recomputation levels while `static` runs every clip at degree 2: the plans really
differ. (Replicated, a rank holds 16 bytes a parameter and AdamW's temporaries after backward: any
budget it fits holds a MAX_LEN clip on one rank, and its plans need not mix degrees.)

Exactness (as for text, `test_run.py`): a resumed run replays the same plans on the same
parameters, optimizer state and data position, so its losses equal the uninterrupted run's bit
for bit. Different plans sum the same per-token losses in another order (packing, 2D-SP
shards, all-reduce); after 3 AdamW steps the parameters differ by float rounding that AdamW
magnifies (`ballast.verify`'s PARAM_TOLERANCE: a drift of 1e-3 of the distance travelled; a
lost or doubly counted clip moves it to ~1e-1).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from train_runs import run_config

from ballast.dataset import open_clip_stream
from ballast.vocabulary.model_shape import MODEL_PRESETS
from ballast.models import build_model
from ballast.runtime import run_local
from ballast.train import checkpoint_files
from ballast.train.config import TrainConfig
from ballast.train.metrics import final_history
from ballast.verify import PARAM_TOLERANCE, budget
from ballast.vocabulary.sharding import Sharding

DATA = "video-synthetic:3"
MAX_LEN = 512
BUDGET = 2048
STEPS = 3
LOSS_RTOL = 1e-5
"""Losses of two plans at the same parameters differ in summation order only (~1e-7)."""

pytestmark = [pytest.mark.slow,
              # final_parameters reads a checkpoint in this one process, as DCP allows.
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def small_memory_gb(model: str, sharding: Sharding) -> float:
    """`ballast verify`'s budget for `model` held as `sharding` holds it: under FSDP2 a MAX_LEN clip
    needs SP degree 2 even with every block recomputed, and shorter ones fit one rank."""
    return budget(MODEL_PRESETS[model], 2, MAX_LEN, sharding=sharding)[1].device_memory / 1e9


def config(out: Path, steps: int, planner: str = "ballast", model: str = "stdit-tiny",
           sharding: Sharding = Sharding.FSDP, report: bool = False) -> TrainConfig:
    return run_config(out, steps, model=model, source=DATA, max_len=MAX_LEN, tokens_per_step=BUDGET,
                      device_memory_gb=small_memory_gb(model, sharding), planner=planner,
                      degree=2 if planner == "static" else None, decay_steps=STEPS, timeout=120.0,
                      # a checkpoint at the end of each run only: the resume starts from the
                      # split run's last, `final_parameters` reads each run's last
                      checkpoint_interval=0, zero1=sharding is Sharding.ZERO1,
                      fsdp=sharding is Sharding.FSDP, report=report)


def _train_all(configs: list[TrainConfig]) -> list[dict | None]:
    from ballast.train.loop import train

    return [train(c) for c in configs]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("video-runs")
    outs = {name: root / name for name in ("whole", "split", "static", "replicated", "zero1", "dit")}
    configs = [config(outs["whole"], STEPS, report=True), config(outs["split"], 2), config(outs["split"], STEPS),
               config(outs["static"], STEPS, planner="static"),
               config(outs["replicated"], STEPS, sharding=Sharding.REPLICATED),
               config(outs["zero1"], STEPS, sharding=Sharding.ZERO1),
               config(outs["dit"], 2, model="dit-tiny", sharding=Sharding.REPLICATED)]
    run_local(2, _train_all, configs, timeout=900)
    return outs


def history(out: Path) -> list[dict]:
    return final_history(out / "metrics.jsonl")


def final_parameters(out: Path, model: str = "stdit-tiny") -> torch.Tensor:
    """The parameters of the run's last checkpoint, flattened in model order."""
    module = build_model(MODEL_PRESETS[model])
    state = {"model": get_model_state_dict(module)}
    dcp.load(state, checkpoint_id=checkpoint_files.latest(out / "checkpoints"))
    module.load_state_dict(state["model"])
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def drift(got: torch.Tensor, want: torch.Tensor, start: torch.Tensor) -> float:
    """||got - want|| relative to how far training moved the parameters (`ballast.verify`)."""
    return float((got - want).norm() / (want - start).norm())


def test_resume_is_bit_identical(runs):
    whole, split = history(runs["whole"]), history(runs["split"])
    assert len(whole) == STEPS and len((runs["split"] / "metrics.jsonl").read_text().splitlines()) == STEPS
    assert [r["loss"] for r in split] == [r["loss"] for r in whole]
    assert torch.equal(final_parameters(runs["split"]), final_parameters(runs["whole"]))


def test_static_and_ballast_end_at_the_same_parameters(runs):
    ours, static = history(runs["whole"]), history(runs["static"])
    assert [r["sample_ids"] for r in ours] == [r["sample_ids"] for r in static]
    layouts = [[(r["degrees"], r["micro_batches"], r["recomputed"]) for r in h] for h in (ours, static)]
    assert layouts[0] != layouts[1], "the planners made the same plans: the test would prove nothing"
    assert all(r["degrees"] == [2] for r in static)
    assert [r["loss"] for r in ours] == pytest.approx([r["loss"] for r in static], rel=LOSS_RTOL)
    start = torch.cat([p.detach().reshape(-1) for p in build_model(MODEL_PRESETS["stdit-tiny"]).parameters()])
    assert drift(final_parameters(runs["whole"]), final_parameters(runs["static"]), start) <= PARAM_TOLERANCE


@pytest.mark.parametrize("sharding", ["replicated", "zero1"])
def test_every_sharding_mode_trains_as_fsdp(runs, sharding):
    # each mode plans at its own budget: the plans may differ, the sums they make may not
    ours, sharded = history(runs["whole"]), history(runs[sharding])
    assert [r["loss"] for r in sharded] == pytest.approx([r["loss"] for r in ours], rel=LOSS_RTOL)
    start = torch.cat([p.detach().reshape(-1) for p in build_model(MODEL_PRESETS["stdit-tiny"]).parameters()])
    assert drift(final_parameters(runs[sharding]), final_parameters(runs["whole"]), start) <= PARAM_TOLERANCE


def test_every_clip_once_and_the_report(runs):
    stream = open_clip_stream(DATA, MODEL_PRESETS["stdit-tiny"].video_geometry, BUDGET, MAX_LEN, 0)
    expected = [stream.next_batch() for _ in range(STEPS)]
    records = history(runs["whole"])
    assert [r["sample_ids"] for r in records] == [b.sample_ids for b in expected]
    assert [r["lengths"] for r in records] == [b.lengths for b in expected]
    for r in records:
        assert r["tokens"] == sum(r["lengths"]) <= BUDGET and max(r["lengths"]) <= MAX_LEN
        assert r["loss"] > 0 and set(r["degrees"]) <= {1, 2}
    assert any(r["degrees"] == [1, 2] for r in records), "ballast should mix degrees at this budget"
    summary = json.loads((runs["whole"] / "report" / "summary.json").read_text())
    assert summary["steps"] == STEPS
    assert (runs["whole"] / "report" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_full_attention_dit_trains(runs):
    records = history(runs["dit"])
    assert len(records) == 2 and all(r["loss"] > 0 for r in records)
