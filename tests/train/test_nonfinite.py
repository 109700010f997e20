"""A non-finite loss stops `ballast train` before the optimizer step, on 2 gloo ranks.

Data: a video-latents folder of six clean clips, of which the one step 2 draws is replaced by an
all-NaN clip of the same shape once step 1's checkpoint is written. Resuming, step 2's loss is
NaN: the run ends with one error naming the step and that clip, exit code 2, and step 1's
checkpoint stays byte for byte as it was (nothing is saved after it). With --skip-nonfinite the
same run skips step 2 (counted in metrics.jsonl) and its checkpoint holds step 1's weights.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from ballast.cli import main
from ballast.dataset import open_clip_stream
from ballast.vocabulary.model_shape import MODEL_PRESETS
from ballast.models import build_model
from ballast.train import checkpoint_files
from ballast.train.metrics import final_history

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

MODEL = "stdit-tiny"
LATENT = (4, 2, 8, 8)
"""[channels, frames, height, width]: 2 x 4 x 4 = 32 patches under stdit-tiny's 1x2x2 patches."""
BUDGET = 64
FLAGS = ["--model", MODEL, "--max-len", str(BUDGET), "--tokens-per-step", str(BUDGET), "--steps", "3",
         "--checkpoint-interval", "1", "--timeout", "60", "--no-report"]


def parameters(folder: Path) -> torch.Tensor:
    model = build_model(MODEL_PRESETS[MODEL])
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=folder)
    return torch.cat([t.reshape(-1) for t in state["model"].values()])


@pytest.mark.timeout(300)
def test_nan_clip_stops_before_the_optimizer_step(tmp_path, capfd):
    folder = tmp_path / "latents"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        np.save(folder / f"clip-{i}.npy", rng.standard_normal(LATENT).astype(np.float32))
    data = f"video-latents:{folder}"
    stream = open_clip_stream(data, MODEL_PRESETS[MODEL].video_geometry, BUDGET, BUDGET, 0)
    first, second = stream.next_batch(), stream.next_batch()
    assert len(second.sample_ids) == 2
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "--steps", "1", "--data", data, "--out-dir", str(out)]) == 0
    good = out / "checkpoints" / "step-00000001"
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    kept = shutil.copytree(good, tmp_path / "step-1")
    poisoned = second.sample_ids[0]
    np.save(folder / f"clip-{poisoned}.npy", np.full(LATENT, np.nan, dtype=np.float32))
    capfd.readouterr()

    code = main(["train", *FLAGS, "--data", data, "--out-dir", str(out)])
    err = capfd.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len([line for line in err.splitlines() if "error:" in line]) == 1, err
    named = re.search(r"ballast train: error: rank 0: step 2/3: loss nan, gradient norm nan, with a non-finite "
                      r"loss in the micro-batch\(es\) of (.*): stopped before the optimizer step", err)
    assert named, err
    assert f"sample {poisoned} ({folder / f'clip-{poisoned}.npy'})" in named.group(1)
    assert set(map(int, re.findall(r"sample (\d+)", named.group(1)))) <= set(second.sample_ids)
    assert [p.name for p in checkpoint_files.committed(out / "checkpoints")] == ["step-00000001"]
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before
    checkpoint_files.check(good)  # intact, checksums and all

    assert main(["train", *FLAGS, "--skip-nonfinite", "--data", data, "--out-dir", str(out)]) == 0
    printed = capfd.readouterr().out
    assert "step 2/3: loss nan" in printed and "step skipped (--skip-nonfinite" in printed
    assert "skipped     1 step(s)" in printed
    history = final_history(out / "metrics.jsonl")
    assert [r["skipped"] for r in history] == [False, True, False]
    assert [r["sample_ids"] for r in history[:2]] == [first.sample_ids, second.sample_ids]
    # the skipped step left the weights as step 1 made them
    assert parameters(out / "checkpoints" / "step-00000002").equal(parameters(kept))
