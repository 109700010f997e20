"""Derive ballast/dataset/wikipedia_hist.json from the raw Wikipedia sequence lengths.

ballast does not ship `data/lengths/wikipedia.txt` (1M lengths); it ships this histogram,
which is small enough for the package and reproduces the file's quantiles within 2% when
sampled (see `ballast.dataset.lengths.HistogramSource`). Bin edges follow one rule,
`next = max(edge + 1, round(edge * 1.01))`: unit bins (exact counts) while 1% of the length
is below one token, ~1% wide log bins above. Only non-empty bins are written. The file's own
quantiles are recorded too, so tests can check the histogram without the raw file.

Usage: python tools/make_wikipedia_hist.py [LENGTHS_TXT] [OUT_JSON]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = REPO.parent / "shared" / "data" / "lengths" / "wikipedia.txt"
DEFAULT_OUTPUT = REPO / "ballast" / "dataset" / "wikipedia_hist.json"
RATIO = 1.01
QUANTILES = (0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99, 0.999, 0.9999)


def bin_edges(max_length: int, ratio: float = RATIO) -> np.ndarray:
    """Integer edges 1 = e0 < e1 < ... with the last edge > max_length (bins are [e_k, e_k+1))."""
    edges = [1]
    while edges[-1] <= max_length:
        edges.append(max(edges[-1] + 1, round(edges[-1] * ratio)))
    return np.array(edges, dtype=np.int64)


def histogram(lengths: np.ndarray) -> dict:
    """The JSON document: non-empty bins as [lo, hi_exclusive, count] plus the file's quantiles."""
    if lengths.size == 0 or lengths.min() < 1:
        raise ValueError("lengths must be a non-empty list of positive integers")
    edges = bin_edges(int(lengths.max()))
    counts = np.bincount(np.searchsorted(edges, lengths, side="right") - 1, minlength=edges.size - 1)
    keep = np.nonzero(counts)[0]
    return {
        "description": "Log-binned histogram of data/lengths/wikipedia.txt "
                       "(made by tools/make_wikipedia_hist.py); bins are [lo, hi) with counts.",
        "count": int(lengths.size),
        "ratio": RATIO,
        "max": int(lengths.max()),
        "quantiles": {str(q): round(float(np.quantile(lengths, q)), 3) for q in QUANTILES},
        "bins": [[int(edges[k]), int(edges[k + 1]), int(counts[k])] for k in keep],
    }


def dumps(doc: dict) -> str:
    """JSON with one bin per line: compact, yet diffs stay readable when the data changes."""
    head = json.dumps({k: v for k, v in doc.items() if k != "bins"}, indent=1)[:-2]
    bins = ",\n".join(f"  [{lo}, {hi}, {n}]" for lo, hi, n in doc["bins"])
    return f'{head},\n "bins": [\n{bins}\n ]\n}}\n'


def main(argv: list[str]) -> None:
    src = Path(argv[0]) if argv else DEFAULT_INPUT
    out = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUTPUT
    lengths = np.loadtxt(src, dtype=np.int64, ndmin=1)
    doc = histogram(lengths)
    out.write_text(dumps(doc))
    print(f"{src}: {doc['count']} lengths -> {len(doc['bins'])} bins, {out.stat().st_size} bytes in {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
