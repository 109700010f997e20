"""What a text source is (`sources.py` parses and reads the specs; `hf_datasets.py` the
`hf-dataset:PATH` one) and what reading it yields: documents, or `Bad`s naming what is wrong."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Doc:
    text: str
    nbytes: int
    """Input bytes this document accounts for (progress only)."""


@dataclass(frozen=True)
class Bad:
    where: str
    """File, and line or row when the problem is in one."""
    reason: str
    kind: str
    """Short category the skip counts are reported by ("bad JSON", "empty", ...)."""
    nbytes: int


@dataclass(frozen=True)
class TextSource:
    spec: str
    """Canonical spec (absolute path): part of the cache key and of reports."""
    kind: str
    files: tuple[str, ...]
    """Absolute paths in reading order (for hf-dataset: every file the dataset is made of,
    which is what its cache key hashes)."""
    text_field: str | None
    """The JSON key or Parquet column of the text; None for one-document-per-file kinds."""
    root: str | None = None
    """hf-dataset: the folder or file the spec names (a saved dataset is read as a whole)."""


def files_under(root: Path, suffix: str) -> list[str]:
    """Regular files under root ending in suffix, sorted; hidden files and folders (.git,
    .DS_Store) are not data, and symlinked folders are not followed (no cycles)."""
    found = []
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
        found += [os.path.join(folder, n) for n in names
                  if not n.startswith(".") and n.endswith(suffix)
                  and os.path.isfile(os.path.join(folder, n))]
    return sorted(found)
