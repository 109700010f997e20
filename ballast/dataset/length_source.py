"""The interface every length source implements (`lengths.py`: text, `clip_sources.py`: video),
and the reader of the files their specs name."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Iterator

import numpy as np


class LengthSource(ABC):
    """A distribution of samples; `name` is its canonical spec, for reports."""

    name: str

    @abstractmethod
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` iid samples drawn with `rng`, so a seed fixes the stream: int64 lengths >= 1
        (shape [n]), or clips as int64 (frames, height, width) rows (shape [n, 3])."""


def numbered_lines(spec: str, what: str) -> Iterator[tuple[int, str]]:
    """(line number, stripped text) of every line of the file `spec` names (`file:PATH`,
    `videos:PATH`) that holds something: blank lines and `#` comments are skipped, so trailing
    newlines and hand-edited files work. An unreadable file is a ValueError naming it."""
    path = spec.partition(":")[2]
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ValueError(f"{spec}: cannot read {what} ({e.strerror or e})") from e
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if text and not text.startswith("#"):
            yield number, text
