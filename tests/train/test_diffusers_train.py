"""`ballast train --model diffusers:PATH`: diffusers' tiny test Wan trained on 2 gloo ranks.

One spawn trains on a `video-latents:` folder of captioned clips (`wan_cases.save_latents`):
STEPS steps with the `ballast` planner; 2 steps then a resume to STEPS (a step past the
warm-up, from the checkpoint's optimizer state, data position and schedule); STEPS steps under
FSDP2. (`video-synthetic`'s captioned clips through the Wan: `test_diffusers_wan.py`.) What it
checks: a resumed run's losses and exported weights equal the uninterrupted run's bit for bit
(DCP and safetensors store the raw tensors); the folder written back (`diffusers-model/`) loads
with `WanTransformer3DModel.from_pretrained`, holds exactly the trained weights, and diffusers'
own forward of it gives the trained wrapper's packed loss (float rounding of another summation
order: LOSS_RTOL, as in `tests/models/test_diffusers_wan.py`); FSDP2 gathers the whole model
into it and trains the same model as replicated weights (verify's PARAM_TOLERANCE on the drift).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from train_runs import run_config
from wan_cases import captioned, diffusers_loss, save_latents, save_wan

from ballast.models import PackedStream, build_model
from ballast.runtime import run_local
from ballast.train import checkpoint_files
from ballast.train.hf_folder import DIFFUSERS_MODEL_DIR
from ballast.train.metrics import final_history
from ballast.verify import PARAM_TOLERANCE, budget
from ballast.vocabulary.model_shape import get_model_shape

GRIDS = [(3, 4, 5), (1, 6, 6), (2, 3, 1), (1, 1, 1), (4, 2, 2), (1, 2, 7), (2, 5, 5), (5, 1, 3)] * 2
MAX_LEN = 64
BUDGET = 192
STEPS = 3
LOSS_RTOL = 1e-5

pytestmark = [pytest.mark.slow,
              # from_checkpoint reads a checkpoint in this one process, as DCP allows.
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def _train_all(configs) -> list[dict | None]:
    from ballast.train.loop import train

    return [train(c) for c in configs]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path | str]:
    root = tmp_path_factory.mktemp("wan-runs")
    model = f"diffusers:{save_wan(root / 'wan')}"
    data = f"video-latents:{save_latents(root / 'latents', GRIDS)}"
    memory = budget(get_model_shape(model), 2, MAX_LEN)[1].device_memory / 1e9

    def config(out: Path, steps: int, **optimizer):
        return run_config(out, steps, model=model, source=data, max_len=MAX_LEN, tokens_per_step=BUDGET,
                          device_memory_gb=memory, decay_steps=STEPS, timeout=120.0, checkpoint_interval=0,
                          **optimizer)

    outs = {name: root / name for name in ("whole", "split", "fsdp")}
    configs = [config(outs["whole"], STEPS), config(outs["split"], 2), config(outs["split"], STEPS),
               config(outs["fsdp"], STEPS, fsdp=True)]
    run_local(2, _train_all, configs, timeout=900)
    return {"model": model, **outs}


def losses(out: Path) -> list[float]:
    return [r["loss"] for r in final_history(out / "metrics.jsonl")]


def exported(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(out / DIFFUSERS_MODEL_DIR / "diffusion_pytorch_model.safetensors")


def from_checkpoint(model: str, out: Path) -> torch.nn.Module:
    """The wrapper (`DiffusersWan`) with the weights of the run's newest checkpoint, in this process."""
    wrapper = build_model(get_model_shape(model))
    state = {"model": get_model_state_dict(wrapper)}
    dcp.load(state, checkpoint_id=checkpoint_files.latest(out / "checkpoints"))
    wrapper.load_state_dict(state["model"])
    return wrapper


def test_resume_is_bit_identical(runs):
    assert len(losses(runs["whole"])) == STEPS and losses(runs["split"]) == losses(runs["whole"])
    whole, split = exported(runs["whole"]), exported(runs["split"])
    assert whole.keys() == split.keys() and all(torch.equal(split[k], whole[k]) for k in whole)


def test_folder_loads_with_the_trained_weights_and_outputs(runs):
    from diffusers import WanTransformer3DModel

    out = runs["whole"]
    folder = out / DIFFUSERS_MODEL_DIR
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert summary["hf_model"] == str(folder) and summary["hf_model_loader"] == "WanTransformer3DModel"
    note = json.loads((folder / "ballast.json").read_text())
    assert note["trained_from"] == runs["model"] and note["steps"] == STEPS
    loaded = WanTransformer3DModel.from_pretrained(folder)
    trained = from_checkpoint(runs["model"], out)
    weights = {k.removeprefix("wan."): v for k, v in trained.state_dict().items()}
    assert loaded.state_dict().keys() == weights.keys()
    assert all(torch.equal(loaded.state_dict()[k], weights[k]) for k in weights), "the folder holds other weights"
    clips = captioned(trained.shape, GRIDS[:6])
    stream = PackedStream.of([trained.sample_shape(c) for c in clips])
    with torch.no_grad():
        packed = trained.loss(clips, stream, slice(0, stream.bounds[-1])).item()
        alone = diffusers_loss(loaded, clips, trained.patch).item()
    assert packed == pytest.approx(alone, rel=LOSS_RTOL)


def test_fsdp_gathers_the_whole_model_and_trains_the_same_one(runs):
    fsdp, whole = exported(runs["fsdp"]), exported(runs["whole"])
    trained = from_checkpoint(runs["model"], runs["fsdp"])
    assert all(torch.equal(fsdp[k.removeprefix("wan.")], v) for k, v in trained.state_dict().items())
    assert losses(runs["fsdp"]) == pytest.approx(losses(runs["whole"]), rel=LOSS_RTOL)
    start = {k.removeprefix("wan."): v for k, v in build_model(get_model_shape(runs["model"])).state_dict().items()}

    def flat(weights):
        return torch.cat([weights[k].reshape(-1) for k in sorted(start)])
    assert float((flat(fsdp) - flat(whole)).norm() / (flat(whole) - flat(start)).norm()) <= PARAM_TOLERANCE

