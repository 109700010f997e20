#!/usr/bin/env bash
# docs/results.md's Hugging Face Llama result: a tiny Hugging Face Llama (the `tiny` preset's shape:
# 4 layers, hidden 128, 8 heads, 4 kv heads, ffn 352, byte vocabulary; random weights from a
# seed) trained on the stdlib corpus on 2 gloo ranks by `ballast`'s plans against `static` forced
# to SP degree 2 (how a transformers / accelerate Ulysses user runs it: one sp_size for every
# step), the same batches, interleaved per step, 3 rounds. Cost model: a `ballast profile` of
# the same HF model made here first, at its full depth (bench/results/hf-llama-profile.json),
# so the JSON's prediction error is the profiled model's.
#
# Usage: bench/hf.sh     (about 6 minutes; waits for a quiet machine first, see bench/quiet.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
BALLAST=${BALLAST:-.venv/bin/ballast}
PYTHON=${PYTHON:-.venv/bin/python}
OUT=bench/results
MODEL=runs/hf-tiny-llama
source bench/quiet.sh
mkdir -p "$OUT"

$PYTHON - "$MODEL" <<'PY'
import sys
from transformers import LlamaConfig
LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4, max_position_embeddings=8192, tie_word_embeddings=False,
            architectures=["LlamaForCausalLM"]).save_pretrained(sys.argv[1])
PY
wait_for_quiet
$BALLAST profile --model "hf:$MODEL" --world 2 --max-len 8192 --depths 4 --out "$OUT/hf-llama-profile.json"
wait_for_quiet
$BALLAST bench --model "hf:$MODEL" --data stdlib --world 2 --planners static,ballast --degree 2 \
    --max-len 8192 --tokens-per-step 16384 --steps 4 --warmup 1 --repeats 3 \
    --cost "$OUT/hf-llama-profile.json" --json "$OUT/hf-llama.json"
$PYTHON bench/results_doc.py
