"""`static` and `ballast` train the same model: loss curves of both from the same seed.

Runs `ballast train` twice on the stdlib corpus (tiny model, 2 local gloo ranks), once per
planner, with everything else equal, then plots both loss curves and their relative
difference into bench/results/convergence.png (numbers in convergence.json). `static` runs
at SP degree 2 throughout, as a DeepSpeed-Ulysses user fixes it; `ballast` chooses per step
(mostly degree 1, with recomputation, under this memory budget), so the two lay every step
out differently; the executor's loss is summed per token over the global batch, so the
gradients, and the curves, differ only by float rounding.

    .venv/bin/python bench/convergence.py [--steps 60] [--out bench/results]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ballast.cli import main as ballast
from ballast.command_line.provenance import provenance
from ballast.train.metrics import final_history

PLANNERS = {"static": ["--degree", "2"], "ballast": []}
"""Planner -> its own flags."""
SETTING = ["--model", "tiny", "--data", "stdlib", "--world", "2", "--max-len", "512",
           "--tokens-per-step", "2048", "--device-memory-gb", "0.012", "--seed", "0",
           "--checkpoint-interval", "0", "--log-interval", "20"]


def plot(histories: dict[str, list[dict]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=(3, 1.4))
    for (name, history), style in zip(histories.items(), ("-", "--")):
        top.plot([r["step"] for r in history], [r["loss"] for r in history], style, label=name)
    top.set_ylabel("loss (nats per token)")
    top.set_title("tiny model on the stdlib corpus, 2 ranks, same seed; static at SP degree 2",
                  fontsize=10, loc="left")
    top.legend()
    a, b = histories.values()
    gap = [abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b)]
    bottom.semilogy([r["step"] for r in a], [max(g, 1e-9) for g in gap], color="black", linewidth=0.9)
    bottom.set_ylabel("relative difference\n(equal: drawn at 1e-9)")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    origin = provenance()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    histories: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="ballast-convergence-") as runs:
        for planner, own in PLANNERS.items():
            folder = Path(runs) / planner
            code = ballast(["train", "--planner", planner, "--steps", str(args.steps), "--out-dir", str(folder),
                            *SETTING, *own])
            if code:
                return code
            histories[planner] = final_history(folder / "metrics.jsonl")
    a, b = histories.values()
    different = sum((x["degrees"], x["micro_batches"], x["recomputed"]) !=
                    (y["degrees"], y["micro_batches"], y["recomputed"]) for x, y in zip(a, b))
    worst = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b))
    plot(histories, out / "convergence.png")
    result = {"setting": SETTING, "planner_flags": PLANNERS, "steps": args.steps, "steps_with_different_plans": different,
              "max_relative_loss_difference": worst,
              "planners": {name: {"losses": [r["loss"] for r in h],
                                  "tokens_per_s": sum(r["tokens"] for r in h[1:]) / sum(r["step_time"] for r in h[1:]),
                                  "degrees": sorted({d for r in h for d in r["degrees"]})}
                           for name, h in histories.items()}, "provenance": origin}
    (out / "convergence.json").write_text(json.dumps(result, indent=1))
    print(f"{different} of {args.steps} steps were laid out differently; largest relative loss "
          f"difference {worst:.2e}; wrote {out / 'convergence.png'} and {out / 'convergence.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
