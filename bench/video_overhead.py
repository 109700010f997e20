"""Per-clip overhead of the video DiTs: forward + backward time per token of one packed stream,
by clips per micro-batch (one clip of ~900 tokens, 96 of ~10, 480 of ~2, and a micro-batch of
video-synthetic's: the smallest clips of its first 8192-token step, up to 2048 tokens), for
stdit-tiny and dit-tiny on one CPU thread. Printed as a table and written as JSON.

Clips are `ballast.verify.reference.random_clips` (random frame/height/width splits, labels and
keys), one generator per model drawing the three streams in turn; the last stream's clips are
`video-synthetic:3`'s (`source` "video-synthetic" in the JSON). Each point is the median of
`--repeats` timed runs of `loss(...).backward()` after one warm-up run; `ratio` is the point's
time per token over the one-clip stream's.

    python bench/video_overhead.py [--repeats 5] [--out bench/results/video-overhead.json]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from ballast.command_line.provenance import provenance
from ballast.dataset.video import open_clip_stream
from ballast.vocabulary.model_shape import MODEL_PRESETS
from ballast.models import PackedStream, build_model
from ballast.verify.reference import random_clips

MODELS = ("stdit-tiny", "dit-tiny")
STREAMS = ((1, 960), (96, 10), (480, 2))
"""(clips, at most tokens per clip) of each stream."""
SYNTHETIC_TOKENS = 2048
"""Tokens of the video-synthetic micro-batch at most."""


def synthetic_clips(shape) -> list:
    """The smallest clips of video-synthetic:3's first 8192-token step, up to SYNTHETIC_TOKENS."""
    clips = open_clip_stream("video-synthetic:3", shape.video_geometry, tokens_per_step=8192, max_len=2048,
                             seed=0).next_batch().samples
    clips = sorted(clips, key=lambda clip: clip.latent.numel())
    picked, tokens = [], 0
    for clip in clips:
        size = clip.latent[0].numel() // math.prod(shape.video_geometry.patch)
        if tokens + size > SYNTHETIC_TOKENS:
            break
        picked.append(clip)
        tokens += size
    return picked


def measure(name: str, repeats: int) -> list[dict]:
    shape = MODEL_PRESETS[name]
    model = build_model(shape)
    rng = np.random.default_rng(0)
    rows = []
    streams = [("random", random_clips(shape, [size] * clips, rng).samples) for clips, size in STREAMS]
    streams.append(("video-synthetic", synthetic_clips(shape)))
    for source, samples in streams:
        stream = PackedStream.of([model.sample_shape(clip) for clip in samples])
        tokens = stream.bounds[-1]
        seconds = []
        for run in range(repeats + 1):
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            model.loss(samples, stream, slice(0, tokens)).backward()
            if run:  # the first is a warm-up
                seconds.append(time.perf_counter() - start)
        ms = statistics.median(seconds) * 1e3
        rows.append({"model": name, "source": source, "clips": len(samples), "tokens": tokens, "ms": round(ms, 2),
                     "us_per_token": round(ms * 1e3 / tokens, 1)})
    for row in rows:
        row["ratio"] = round(row["us_per_token"] / rows[0]["us_per_token"], 2)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "video-overhead.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    origin = provenance()
    rows = [row for name in MODELS for row in measure(name, args.repeats)]
    print(f"{'model':<12}{'clips':>6}{'tokens':>8}{'ms':>10}{'us/token':>10}{'ratio':>7}")
    for row in rows:
        print(f"{row['model']:<12}{row['clips']:>6}{row['tokens']:>8}{row['ms']:>10.1f}{row['us_per_token']:>10.1f}"
              f"{row['ratio']:>7.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"threads": 1, "repeats": args.repeats, "points": rows, "provenance": origin}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
