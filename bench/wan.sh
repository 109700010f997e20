#!/usr/bin/env bash
# docs/results.md's diffusers Wan result: diffusers' own tiny test Wan (WanTransformer3DModel with
# 2 heads of 12, 2 layers, patch (1, 2, 2), 4 latent channels, text width 16, RoPE over 32 patches
# per axis; seeded random weights written by save_pretrained into runs/wan-tiny) profiled on 2
# gloo ranks as the video DiTs are (bench/profile_record.py with issue #31's video targets: the
# check's median error 6%, its 90th percentile 10%), then trained for 40 steps on a video-latents
# folder of captioned clips (runs/wan-latents) with the folder written back.
#
# Usage: bench/wan.sh     (about 15 minutes; profile_record.py waits for a quiet machine per stage)
set -euo pipefail
cd "$(dirname "$0")/.."
BALLAST=${BALLAST:-.venv/bin/ballast}
PYTHON=${PYTHON:-.venv/bin/python}
OUT=bench/results
MODEL=runs/wan-tiny
LATENTS=runs/wan-latents
mkdir -p "$OUT"

$PYTHON - "$MODEL" "$LATENTS" <<'PY'
import sys
from pathlib import Path

import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import save_file

model, latents = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
                      out_channels=4, text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
                      qk_norm="rms_norm_across_heads", rope_max_seq_len=32).save_pretrained(model)
# Captioned clips of 1 to 60 patches: a per-channel level and ramp with a little noise.
latents.mkdir(parents=True, exist_ok=True)
generator = torch.Generator().manual_seed(0)
grids = [(3, 4, 5), (1, 6, 6), (2, 3, 1), (1, 1, 1), (4, 2, 2), (1, 2, 7), (2, 5, 5), (5, 1, 3)] * 8
for i, (f, h, w) in enumerate(grids):
    ramp = torch.linspace(-1, 1, 2 * w).view(1, 1, 1, -1) * torch.randn(4, 1, 1, 1, generator=generator)
    latent = torch.randn(4, 1, 1, 1, generator=generator) + ramp + 0.1 * torch.randn(4, f, 2 * h, 2 * w, generator=generator)
    save_file({"latent": latent.contiguous(), "caption": torch.randn(1 + i % 5, 16, generator=generator)},
              str(latents / f"clip{i:03d}.safetensors"))
PY
$PYTHON bench/profile_record.py --model "diffusers:$MODEL" --name wan-tiny --median-target 0.06 --p90-target 0.10 \
    --device-memory-gb 12 --max-len 2048 --tokens-per-step 8192 --plans 20 --repeats 5 --statistic min --runs 5
rm -rf runs/wan-train
$BALLAST train --model "diffusers:$MODEL" --data "video-latents:$LATENTS" --world 2 --steps 40 --max-len 128 \
    --tokens-per-step 512 --out-dir runs/wan-train --no-resume
cp runs/wan-train/report/loss.png "$OUT/wan-train-loss.png"
cp runs/wan-train/report/summary.json "$OUT/wan-train-summary.json"
$PYTHON bench/results_doc.py
