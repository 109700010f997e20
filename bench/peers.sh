#!/usr/bin/env bash
# docs/results.md's DeepSpeed-Ulysses result: DeepSpeed-Ulysses (DeepSpeed's own DistributedAttention at SP
# degree 2, the DeepSpeed engine with ZeRO-2) trains bench/hf.sh's tiny Hugging Face Llama on the
# same stdlib batches as ballast's `static` (SP degree 2) and `ballast` plans, in one gloo job on
# 2 ranks, interleaved per step, 1 warm-up + 3 rounds x 4 steps; then one job per system for its
# peak RSS per rank. Cost model: bench/hf.sh's profile (bench/results/hf-llama-profile.json).
#
# Needs the peers virtualenv (bench/peers/requirements.txt says how to make it):
#   PEERS_PYTHON=/work/peers-venv/bin/python bench/peers.sh     (about 9 minutes on a quiet machine)
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS_PYTHON=${PEERS_PYTHON:-/work/peers-venv/bin/python}
PYTHON=${PYTHON:-.venv/bin/python}
OUT=bench/results
source bench/quiet.sh
mkdir -p "$OUT"

if ! DS_ACCELERATOR=cpu "$PEERS_PYTHON" -c "import deepspeed" 2>/dev/null; then
    echo "$PEERS_PYTHON cannot import deepspeed: make the peers virtualenv first (bench/peers/requirements.txt)" >&2
    exit 1
fi
# Twice: at `ballast bench`'s memory budget (a max-len sequence fits without recomputation only at
# SP degree 2, so ballast's plans split a step into micro-batches; the peer, given no budget,
# packs the whole step into one), then at 8 GB per rank, where `static` runs exactly the peer's
# layout (one packed micro-batch at degree 2) and ballast may run a max-len sequence at degree 1.
for RUN in "peers-deepspeed" "peers-deepspeed-8gb --device-memory-gb 8"; do
    set -- $RUN
    wait_for_quiet
    DS_ACCELERATOR=cpu "$PEERS_PYTHON" bench/peers/deepspeed_ulysses.py --model runs/hf-tiny-llama \
        --data stdlib --world 2 --max-len 8192 --tokens-per-step 16384 --steps 4 --warmup 1 --repeats 3 \
        --cost "$OUT/hf-llama-profile.json" --json "$OUT/$1.json" "${@:2}"
done
$PYTHON bench/results_doc.py
