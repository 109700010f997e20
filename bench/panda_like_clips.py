"""Write a clip list shaped like Panda-70M's metadata, for setting V3 (`--lengths videos:PATH`).

Panda-70M (Chen et al., 2024) has 70.8M captioned clips of 2 s to 60 s, 8.5 s on average, cut
from HD-VILA-100M's mostly 720p videos. This draws N clips from that description, seeded:
durations from a lognormal truncated to [2, 60] s with its mean tuned to 8.5 s; resolutions
360p / 480p / 720p / 1080p with weights 15 / 25 / 45 / 15 %; one clip in five portrait. Frames
are counted at 16 fps, the rate Wan 2.1 trains at, plus the first frame (Wan's VAE takes 4k + 1).

    .venv/bin/python bench/panda_like_clips.py --clips 4000 --out bench/data/panda70m-like.txt
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

RESOLUTIONS = {360: 640, 480: 854, 720: 1280, 1080: 1920}
WEIGHTS = (0.15, 0.25, 0.45, 0.15)
FPS = 16
MEAN_SECONDS, LOW, HIGH = 8.5, 2.0, 60.0
SIGMA = 0.75


def durations(rng: np.random.Generator, n: int) -> np.ndarray:
    """Truncated lognormal seconds whose mean is MEAN_SECONDS (mu found by bisection on a
    large reference draw, so the mean holds for the truncated law, not the untruncated one)."""
    reference = np.random.default_rng(0).standard_normal(1_000_000)

    def mean(mu: float) -> float:
        x = np.exp(mu + SIGMA * reference)
        return float(x[(x >= LOW) & (x <= HIGH)].mean())

    lo, hi = 0.0, 4.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean(mid) < MEAN_SECONDS else (lo, mid)
    out = np.empty(0)
    while out.size < n:
        x = np.exp(lo + SIGMA * rng.standard_normal(2 * n))
        out = np.concatenate([out, x[(x >= LOW) & (x <= HIGH)]])
    return out[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/data/panda70m-like.txt")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    seconds = durations(rng, args.clips)
    heights = rng.choice(list(RESOLUTIONS), size=args.clips, p=WEIGHTS)
    portrait = rng.random(args.clips) < 0.2
    lines = [f"# Panda-70M-like clips (bench/panda_like_clips.py --clips {args.clips} --seed {args.seed}): "
             f"frames at {FPS} fps, height, width in pixels"]
    for t, h, p in zip(seconds, heights, portrait):
        frames = 4 * round(t * FPS / 4) + 1
        w = RESOLUTIONS[int(h)]
        lines.append(f"{frames} {w} {h}" if p else f"{frames} {h} {w}")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}: {args.clips} clips, mean {seconds.mean():.2f} s "
          f"({seconds.min():.1f}-{seconds.max():.1f} s), {portrait.mean():.0%} portrait")


if __name__ == "__main__":
    main()
