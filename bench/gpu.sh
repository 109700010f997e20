#!/usr/bin/env bash
# bench/gpu.sh: one command that checks ballast's GPU path on a machine with 1 to 8 GPUs.
#
#   bench/gpu.sh            on the GPUs: the CUDA tests, then every command under torchrun on NCCL
#   bench/gpu.sh --dry-run  its commands under torchrun on the CPU: gloo (2 processes; 4 for the
#                           CP step), fp32, tiny sizes (what `make test` runs); each command and
#                           each launch path once (see `gpu_only`)
#
# Steps: the CUDA tests (pytest -m cuda; any skip fails, a missing flash-attn too); `ballast
# verify` for the tiny GPT (replicated and FSDP2), a Hugging Face Llama with GQA (2 kv heads of
# 4), a 6-head model that runs past its heads with context parallelism (4 ranks or more), the
# STDiT and the Wan-style full-attention DiT, under every planner (the remapping ones among
# them), each compared with the single-process fp32 reference that torchrun's rank 0 runs on its
# GPU (a mismatch fails every rank); a quick `ballast profile` and its `--check`; a short
# `ballast bench` against that profile. Every command runs as a user runs it on a GPU node,
# `torchrun --nproc-per-node N -m ballast.cli ...` (one process per GPU, the largest power of two
# of them up to 8; 4 for the CP step). Every step writes bench/results/gpu-<gpu>-<step>.json
# (its command, exit status, seconds, the end of its log, and the command's own JSON where it
# writes one: the profile, the check's comparison, the bench's results), and
# bench/results/gpu-<gpu>.json sums them up. The first failing step stops the script with its
# exit status.
#
# GPU-only, and so not run by --dry-run: the CUDA tests, NCCL (and with it CUDA placement and
# flash-attn) and `--precision bf16`; the dry run's gloo processes take the same commands,
# launches, joins and exits. The dry run also leaves out three verify steps whose launch path
# another of its steps takes with another model or sharding (`gpu_only`): each torchrun launch
# costs a CPU ~15 s of imports, and on a GPU those steps differ in their CUDA kernels, which a
# CPU does not reach anyway.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
OUT=${BALLAST_GPU_OUT:-bench/results}
case "${1:-}" in
    --dry-run) DRY=1 ;;
    "") DRY=0 ;;
    *) echo "usage: bench/gpu.sh [--dry-run]" >&2; exit 2 ;;
esac
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

if (( DRY )); then
    GPU=cpu-dry-run RANKS=2 PLANNERS=ballast,zeppelin
    PRECISION=()
    # fp32: Ulysses (degree 2 at most with 6 heads) holds 271 tokens, 1x4 with CP 542
    SIX_HEADS_GB=0.00075
    SIZES=(--steps 1 --batch 4 --max-len 128)
    CHECK=(--plans 2 --repeats 1 --tokens-per-step 2048)
    BENCH=(--steps 1 --warmup 1 --repeats 1 --tokens-per-step 1024 --max-len 256)
else
    GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
    if (( GPUS < 1 )); then
        echo "bench/gpu.sh: no CUDA device here; bench/gpu.sh --dry-run runs the CPU stand-ins" >&2
        exit 1
    fi
    RANKS=1
    while (( RANKS * 2 <= GPUS && RANKS < 8 )); do RANKS=$((RANKS * 2)); done
    GPU=$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))')
    PLANNERS=all
    PRECISION=(--precision bf16)
    # bf16 (the autocast copies priced): Ulysses holds 275 tokens, 1x4 with CP past 448
    SIX_HEADS_GB=0.00082
    SIZES=(--steps 2)
    CHECK=(--plans 10)
    BENCH=(--steps 2 --warmup 1 --repeats 2 --tokens-per-step 16384 --max-len 4096)
fi
# One process per rank, as torchrun starts them on a GPU node: NCCL where CUDA is, gloo here.
launch() { "$PY" -m torch.distributed.run --standalone --nproc-per-node "${WORLD:-$RANKS}" -m ballast.cli "$@"; }
TAG=$(printf '%s' "$GPU" | tr -cs 'A-Za-z0-9' '-' | tr 'A-Z' 'a-z' | sed 's/^-*//; s/-*$//')
STEPS=()

# step NAME RESULT_JSON COMMAND...: run it, keep its log, write its record; stop on failure.
step() {
    local name=$1 result=$2 status=0 start=$SECONDS
    shift 2
    echo "== $name: $*"
    "$@" 2>&1 | tee "$WORK/$name.log" || status=$?
    "$PY" - "$OUT/gpu-$TAG-$name.json" "$name" "$status" "$((SECONDS - start))" "$WORK/$name.log" \
        "$result" "$GPU" "${WORLD:-$RANKS}" "$*" <<'EOF'
import json, pathlib, sys
path, name, status, seconds, log, result, gpu, ranks, command = sys.argv[1:]
record = dict(step=name, gpu=gpu, ranks=int(ranks), command=command, exit_status=int(status),
              seconds=int(seconds), log_tail=pathlib.Path(log).read_text(errors="replace").splitlines()[-40:])
if result and pathlib.Path(result).is_file():
    record["result"] = json.loads(pathlib.Path(result).read_text())
pathlib.Path(path).write_text(json.dumps(record, indent=1) + "\n")
EOF
    STEPS+=("$name")
    if (( status != 0 )); then
        echo "bench/gpu.sh: step $name failed with exit status $status (record: $OUT/gpu-$TAG-$name.json)" >&2
        exit "$status"
    fi
}

# gpu_only NAME RESULT COMMAND...: a step of the GPU run only. On a CPU it would repeat a dry-run
# step's launch with another model (the replicated GPT: as the HF Llama's; the DiT: as the
# STDiT's) or sharding (the HF Llama's FSDP2: as the GPT's), and reach no code that step does not.
gpu_only() {
    if (( DRY )); then
        echo "== $1: GPU run only (the dry run takes its launch path in another step)"
    else
        step "$@"
    fi
}

# The CUDA tests, none skipped: a skip means a GPU path went unchecked (no flash-attn, say).
cuda_tests() {
    local out status=0
    out=$("$PY" -m pytest -q -rs -m cuda -p no:cacheprovider tests 2>&1) || status=$?
    echo "$out"
    if grep -q SKIPPED <<<"$out"; then
        echo "a CUDA test was skipped: install what its reason names" >&2
        return 1
    fi
    return "$status"
}

# The models: a Llama with GQA and a 6-head model, made here (no network), and a small corpus.
"$PY" - "$WORK" <<'EOF'
import json, pathlib, sys
sys.path.insert(0, "tests")
from hf_folders import save_model
work = pathlib.Path(sys.argv[1])
save_model(work / "hf-gqa", "LlamaConfig", num_key_value_heads=2)
(work / "six-heads.json").write_text(json.dumps({"name": "six-heads", "layers": 2, "hidden": 48, "heads": 6,
                                                 "kv_heads": 2, "ffn": 64, "vocab": 64}))
corpus = work / "corpus"
corpus.mkdir()
for path in sorted(pathlib.Path("ballast").rglob("*.py"))[:20]:
    (corpus / path.name).write_text(path.read_text())
EOF

if (( ! DRY )); then
    step cuda-tests "" cuda_tests
fi
VERIFY=(verify --planners "$PLANNERS" "${SIZES[@]}" "${PRECISION[@]}")
gpu_only verify-gpt "" launch "${VERIFY[@]}" --model tiny
step verify-gpt-fsdp2 "" launch "${VERIFY[@]}" --model tiny --fsdp
step verify-hf-gqa "" launch "${VERIFY[@]}" --model "hf:$WORK/hf-gqa"
gpu_only verify-hf-gqa-fsdp2 "" launch "${VERIFY[@]}" --model "hf:$WORK/hf-gqa" --fsdp
# Past the heads: a budget at which the longest samples need degree 4, which 6 heads allow
# only as u x c with context parallelism: in fp32 0.75 MB a rank holds 135 tokens, 271 at
# Ulysses' widest degree 2, 542 at degree 4 with CP (tests/verify/test_verify_context.py works
# it out); bf16's autocast copies take more, hence SIX_HEADS_GB per precision.
if (( DRY || RANKS >= 4 )); then
    WORLD=4 step verify-six-heads-cp "" launch verify --planners megatron-dynamic-cp,ballast --steps 1 \
        --batch 6 --max-len 448 --device-memory-gb "$SIX_HEADS_GB" --model "$WORK/six-heads.json" "${PRECISION[@]}"
else
    echo "== verify-six-heads-cp: not run: context parallelism past 6 heads needs 4 GPUs or more, this machine has $RANKS"
fi
step verify-stdit "" launch "${VERIFY[@]}" --model stdit-tiny
gpu_only verify-dit "" launch "${VERIFY[@]}" --model dit-tiny

if (( DRY )); then
    PROFILE=(--lengths 32,128 --depths 1,2 --repeats 1 --verify 1 --held-out 1)
else
    PROFILE=(--quick)
fi
step profile "$WORK/profile.json" launch profile --model tiny "${PROFILE[@]}" --out "$WORK/profile.json" \
    "${PRECISION[@]}"
step profile-check "$WORK/check.json" launch profile --check "$WORK/profile.json" "${CHECK[@]}" \
    --png "$WORK/check.png" --json "$WORK/check.json"
# Against the profile just measured on these ranks' device: its predictions, and its full-depth
# points run again for the machine's drift.
step bench "$WORK/bench.json" launch bench --model tiny --data "folder:$WORK/corpus" --cache-dir "$WORK/cache" \
    --cost "$WORK/profile.json" --planners "$PLANNERS" "${BENCH[@]}" --json "$WORK/bench.json" --png "$WORK/bench.png" \
    "${PRECISION[@]}"

"$PY" - "$OUT" "$TAG" "$GPU" "$RANKS" "$DRY" "${STEPS[@]}" <<'EOF'
import json, pathlib, sys
out, tag, gpu, ranks, dry, *steps = sys.argv[1:]
records = [json.loads((pathlib.Path(out) / f"gpu-{tag}-{name}.json").read_text()) for name in steps]
summary = dict(gpu=gpu, ranks=int(ranks), dry_run=dry == "1", passed=steps,
               seconds={r["step"]: r["seconds"] for r in records})
(pathlib.Path(out) / f"gpu-{tag}.json").write_text(json.dumps(summary, indent=1) + "\n")
print(f"bench/gpu.sh: all {len(steps)} steps passed on {gpu} ({ranks} ranks): {out}/gpu-{tag}.json")
EOF
