"""Small seeded JSONL corpora of English-like documents, for the tests that train for real."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

WORDS = ("the of and to in is that for it as with was on be by this are from or an which one "
         "data model rank plan wave group token sequence step loss gradient").split()


def jsonl_corpus(folder: Path, documents: int, longest: int, seed: int) -> tuple[str, str]:
    """(source spec, cache dir) of `documents` documents whose byte lengths are log-uniform in
    16..`longest` (a long tail, as real corpora have)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(documents):
        size = int(math.exp(rng.uniform(math.log(16), math.log(longest))))
        text = ""
        while len(text) < size:
            text += rng.choice(WORDS) + " "
        lines.append(json.dumps({"text": text[:size]}))
    (folder / "docs.jsonl").write_text("\n".join(lines) + "\n")
    return f"jsonl:{folder / 'docs.jsonl'}", str(folder / "cache")
