"""Length sources: real corpora, files and synthetic distributions of sequence lengths.

Planners only ever see samples, so a corpus is reduced to a `LengthSource` (`length_source.py`):
iid draws of token counts (text) or of clip shapes (video, `clip_sources.py`). `get_length_source(spec)`
parses the `--lengths` flag:

  wikipedia            1M real lengths, shipped as a log-binned histogram (the raw file is not
                       redistributed; `file:` reads it where a user has it)
  stdlib               the Python standard library's .py files on this machine (real code)
  file:PATH            one positive integer per line
  lognormal:MU,SIGMA   max(1, round(exp(N(MU, SIGMA))))
  zipf:ALPHA,MIN,MAX   P(s) ~ s^-ALPHA on the integers MIN..MAX
  video                DCP's any-size video as clip shapes: resolution x frames buckets, Zipf
                       weights, in the model's latent patches (`clip_sources.py`)
  videos:PATH          a clip list, `frames height width` in pixels per line (`clip_sources.py`)

`length_stream.LengthStream` cuts a source's draws into per-step batches.
"""
from __future__ import annotations

import functools
import importlib.resources
import json
import math
import os
import sysconfig

import numpy as np

from ..vocabulary.model_shape import OPEN_SORA_VIDEO, VideoGeometry
from .clip_sources import clip_list_source, video_source
from .length_source import LengthSource, numbered_lines

LENGTH_SYNTAX = ("wikipedia | stdlib | video | videos:PATH | file:PATH | lognormal:MU,SIGMA | zipf:ALPHA,MIN,MAX "
          "(e.g. lognormal:6,1.5 or zipf:1.2,64,32768)")


class DiscreteSource(LengthSource):
    """Draws from a finite list of lengths, uniformly or with the given weights."""

    def __init__(self, name: str, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        self.name = name
        self.values = np.asarray(values, dtype=np.int64)
        self.p = None if weights is None else np.asarray(weights, float) / np.sum(weights)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(self.values, size=n, p=self.p)


class HistogramSource(LengthSource):
    """Draws a bin [lo, hi) by count, then a length log-uniformly inside it.

    Log-uniform rather than uniform because length densities fall roughly as a power law, so
    inside a bin short lengths are likelier than long ones.
    """

    def __init__(self, name: str, lo: np.ndarray, hi: np.ndarray, counts: np.ndarray) -> None:
        self.name = name
        self.lo, self.hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
        self.cdf = np.cumsum(counts, dtype=float) / np.sum(counts)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        # The clamp guards cdf[-1] rounding to just below 1.
        k = np.minimum(np.searchsorted(self.cdf, rng.random(n), side="right"), self.cdf.size - 1)
        lo, hi = self.lo[k], self.hi[k]
        x = np.floor(lo * np.exp(rng.random(n) * np.log(hi / lo))).astype(np.int64)
        return np.minimum(x, hi - 1)  # float rounding must not leave the bin


class LognormalSource(LengthSource):
    def __init__(self, mu: float, sigma: float) -> None:
        self.name, self.mu, self.sigma = f"lognormal:{mu:g},{sigma:g}", mu, sigma

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        # exp overflows to inf for extreme parameters; cap so the int64 cast stays defined.
        x = np.minimum(np.exp(rng.normal(self.mu, self.sigma, n)), 2.0**53)
        return np.maximum(1, np.rint(x)).astype(np.int64)


class ZipfSource(LengthSource):
    """Exact bounded Zipf by rejection-inversion (Hörmann & Derflinger 1996).

    Inverting the continuous power law and flooring is cheaper to write but biased for small
    lengths (P(1)/P(2) comes out 3 instead of 4 at ALPHA=2); rejection-inversion is exact, O(1)
    per draw and accepts most proposals.
    """

    def __init__(self, alpha: float, lo: int, hi: int) -> None:
        self.name, self.alpha, self.lo, self.hi = f"zipf:{alpha:g},{lo},{hi}", alpha, lo, hi
        self.u_lo = float(self._H(lo + 0.5)) - lo ** -alpha
        self.u_hi = float(self._H(hi + 0.5))

    def _H(self, x: np.ndarray | float) -> np.ndarray:
        """Integral of t^-alpha from 1 to x, stable at alpha = 1."""
        lx = np.log(x)
        t = (1 - self.alpha) * lx
        small = np.abs(t) < 1e-8
        return np.where(small, 1 + t / 2, np.expm1(t) / np.where(small, 1, t)) * lx

    def _H_inv(self, u: np.ndarray) -> np.ndarray:
        t = np.maximum(u * (1 - self.alpha), -1 + 1e-12)
        small = np.abs(t) < 1e-8
        return np.exp(np.where(small, 1 - t / 2, np.log1p(t) / np.where(small, 1, t)) * u)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        out, todo = np.empty(n, np.int64), np.arange(n)
        while todo.size:
            u = self.u_lo + rng.random(todo.size) * (self.u_hi - self.u_lo)
            x = self._H_inv(u)
            k = np.clip(np.floor(x + 0.5), self.lo, self.hi)
            ok = u >= self._H(k + 0.5) - k ** -self.alpha
            out[todo[ok]] = k[ok]
            todo = todo[~ok]
        return out


@functools.cache
def wikipedia_source() -> HistogramSource:
    """The shipped histogram of data/lengths/wikipedia.txt (tools/make_wikipedia_hist.py)."""
    text = (importlib.resources.files("ballast.dataset") / "wikipedia_hist.json").read_text()
    lo, hi, counts = np.array(json.loads(text)["bins"], dtype=np.int64).T
    return HistogramSource("wikipedia", lo, hi, counts)


# Third-party packages are not the stdlib, and test suites are left out because distributions
# ship them or not (Debian splits them off), which would make the corpus machine-dependent.
STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test"})


def stdlib_files() -> tuple[str, list[str]]:
    """(root, paths) of the standard library's .py files on this machine, in os.walk order.

    The one definition of the `stdlib` corpus: `stdlib_source` takes its lengths and the
    trainer's data pipeline (ballast.dataset) its text from it. Callers that need a
    machine-independent order sort the paths; empty files are the caller's to drop.
    """
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for folder, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in STDLIB_EXCLUDED_DIRS]  # prune, don't scan
        paths += [os.path.join(folder, f) for f in files if f.endswith(".py")]
    return root, paths


@functools.cache
def stdlib_source() -> DiscreteSource:
    """Token counts of the standard library's .py files, under the byte-level tokenizer.

    Byte-level (one token per UTF-8 byte) is the trainer's default tokenizer too, so a file's
    token count is its size in bytes. Empty files (bare `__init__.py`) are not sequences.
    """
    root, paths = stdlib_files()
    sizes = [s for s in map(os.path.getsize, paths) if s > 0]
    if not sizes:
        raise ValueError(f"stdlib: no non-empty .py files under {root}")
    return DiscreteSource("stdlib", np.array(sizes))


def file_source(path: str) -> DiscreteSource:
    """Lengths from a text file, one positive integer per line (`numbered_lines`); anything
    else is an error naming the line."""
    lengths = []
    for number, text in numbered_lines(f"file:{path}", "length file"):
        if not (text.isascii() and text.isdigit()) or int(text) < 1:
            raise ValueError(f"file:{path} line {number}: expected a positive integer length, "
                             f"got {text[:40]!r}")
        lengths.append(int(text))
    if not lengths:
        raise ValueError(f"file:{path}: no lengths in file (expected one positive integer per line)")
    return DiscreteSource(f"file:{path}", np.array(lengths))


def _numbers(spec: str, args: str, syntax: str, count: int) -> list[float]:
    parts = args.split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(parts) != count or len(values) != count or not all(map(math.isfinite, values)):
        raise ValueError(f"length source {spec!r}: expected {syntax}")
    return values


def get_length_source(spec: str, video: VideoGeometry | None = None) -> LengthSource:
    """Parse a `--lengths` spec; a malformed one is a ValueError stating the expected syntax.
    Clip sources convert pixels to latent patches with `video` (the model's geometry; None:
    Open-Sora 1.2's)."""
    name, colon, args = spec.partition(":")
    fixed = {"wikipedia": wikipedia_source, "stdlib": stdlib_source}
    if name in fixed and not colon:
        return fixed[name]()
    if name == "video" and not colon:
        return video_source(video or OPEN_SORA_VIDEO)
    if name == "videos" and args:
        return clip_list_source(args, video or OPEN_SORA_VIDEO)
    if name == "file" and args:
        return file_source(args)
    if name == "lognormal":
        syntax = "lognormal:MU,SIGMA with SIGMA >= 0, e.g. lognormal:6,1.5"
        mu, sigma = _numbers(spec, args, syntax, 2)
        if sigma < 0:
            raise ValueError(f"length source {spec!r}: expected {syntax}")
        return LognormalSource(mu, sigma)
    if name == "zipf":
        syntax = "zipf:ALPHA,MIN,MAX with ALPHA >= 0 and integers 1 <= MIN <= MAX, e.g. zipf:1.2,64,32768"
        alpha, lo, hi = _numbers(spec, args, syntax, 3)
        if alpha < 0 or not lo.is_integer() or not hi.is_integer() or not 1 <= lo <= hi:
            raise ValueError(f"length source {spec!r}: expected {syntax}")
        return ZipfSource(alpha, int(lo), int(hi))
    raise ValueError(f"unknown length source {spec!r}: expected {LENGTH_SYNTAX}")
