"""The memory model against the real peak of a step (issue #52): the tiny GPT, a tiny Hugging
Face Llama (made here, seeded, in a temporary folder) and the tiny video DiT on 2 gloo ranks, in
every sharding mode, fp32 (the CPU's precision) and bf16 autocast (FSDP2's under its bf16
MixedPrecisionPolicy); predicted vs measured peak per rank (`ballast.profile.memory_check`), written to
bench/results/memory.json.

    python bench/memory_fit.py [--out bench/results/memory.json] [--precisions fp32,bf16]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from ballast.command_line.provenance import provenance
from ballast.profile.memory_check import TOLERANCE, compare, measure_on_rank
from ballast.runtime import run_local
from ballast.vocabulary.model_shape import get_model_shape
from ballast.vocabulary.sharding import Sharding

WORLD = 2
# Two micro-batches per rank, the larger second: a rank's first micro-batch of a step finds no
# gradients yet, which the model (pricing every micro-batch as a later one) does not count on.
# Text: 640 tokens per rank at the peak. The Llama's vocabulary is 8,192 so that its logits weigh
# as a real model's do (Llama-3.2-1B: 128k entries against hidden 2,048; here 8k against 64).
TEXT = [[256], [768, 512]]
CLIPS = [[(2, 8, 8)], [(4, 8, 8), (3, 8, 8)]]  # dit-tiny: 448 latent patches in the second
LLAMA = dict(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, initializer_range=0.02)


def tiny_llama(folder: Path) -> str:
    """A seeded tiny Llama saved with transformers' own save_pretrained; its model spec."""
    import torch
    import transformers

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**LLAMA)).save_pretrained(folder)
    return f"hf:{folder}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/results/memory.json")
    p.add_argument("--precisions", default="fp32,bf16")
    args = p.parse_args()
    runs = [(mode, precision) for precision in args.precisions.split(",") for mode in Sharding.flagged()]
    rows = []
    origin = provenance()
    with tempfile.TemporaryDirectory() as tmp:
        for spec, samples in (("tiny", TEXT), (tiny_llama(Path(tmp) / "llama"), TEXT), ("dit-tiny", CLIPS)):
            shape = get_model_shape(spec)
            start = time.perf_counter()
            per_rank = run_local(WORLD, measure_on_rank, shape, samples, runs, 0, timeout=900)
            for rank, records in enumerate(per_rank):
                for record in records:
                    row = dict(model="hf-llama" if spec.startswith("hf:") else spec, rank=rank,
                               **compare(shape, WORLD, record))
                    rows.append(row)
                    print(f"{row['model']:9s} {row['sharding']:10s} {row['precision']} rank {rank}: measured "
                          f"{row['peak'] / 1e6:7.2f} MB, predicted {row['predicted'] / 1e6:7.2f} MB "
                          f"({row['ratio'] - 1:+.1%}; old model {row['old_ratio'] - 1:+.1%})", flush=True)
            print(f"  {time.perf_counter() - start:.0f} s", flush=True)
    worst = max(abs(r["ratio"] - 1) for r in rows)
    out = {"provenance": origin, "setting": {"world": WORLD, "text_lengths": TEXT, "clips": CLIPS, "llama": LLAMA},
           "tolerance": TOLERANCE, "worst_error": worst, "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"worst |predicted / measured - 1|: {worst:.1%} (tolerance {TOLERANCE:.0%}); wrote {args.out}")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    raise SystemExit(main())
