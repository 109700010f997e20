"""The token cache: where a tokenised corpus lives, what keys it, and how it is written.

An entry is a folder `<cache_dir>/<kind>-<key>/` holding
  tokens.bin    every document's token ids back to back, raw uint16 (vocab <= 65535) or uint32
  offsets.npy   int64, num_documents + 1 entries: document i is tokens[offsets[i]:offsets[i+1]]
  meta.json     vocab size, dtype, counts, skip counts, tokenizer; written last

The key hashes the format version, the source kind and text field, `skip_bad`, the
tokenizer's identity (its file's bytes) and, for every input file, its absolute path, size and
modification time in nanoseconds. Stamps rather than content digests: hashing a large corpus's
bytes would cost as much as re-reading it on every start, while any ordinary edit changes the
mtime (and usually the size). An edit that restores both exactly (`touch -r`, some copy tools)
is not seen: delete the entry (or pass another cache dir) to rebuild.

Writing is atomic: an entry is built in a hidden temporary folder beside it and renamed into
place, so readers see a whole entry or none, and a crash leaves only a temporary folder that
nothing reads. When two processes (ranks) build the same entry, the first rename wins and the
other process uses it.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

FORMAT = 1
"""Bump when the entry layout or the meaning of its contents changes."""
META_KEYS = frozenset({"format", "key", "source", "tokenizer", "tokenizer_identity", "vocab_size",
                       "dtype", "num_documents", "num_tokens", "skipped"})


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "ballast"


def file_stamps(paths: tuple[str, ...] | list[str]) -> list[tuple[str, int, int]]:
    """(path, size, mtime_ns) per file: what the key sees of each input."""
    stamps = []
    for p in paths:
        st = os.stat(p)
        stamps.append((p, st.st_size, st.st_mtime_ns))
    return stamps


def digest(value: object) -> str:
    """sha256 of a JSON-serialisable value, canonically encoded."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


def write_entry(entry: Path, build: Callable[[Path], dict]) -> None:
    """Build an entry atomically: `build(tmp)` writes tokens.bin and offsets.npy into `tmp` and
    returns the meta, which is written last; then `tmp` is renamed to `entry`."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.parent / f".tmp-{entry.name}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        meta = build(tmp)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / "meta.json").is_file():  # not a concurrent builder's win: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_entry(entry: Path) -> tuple[dict, np.ndarray, np.ndarray]:
    """(meta, tokens memmap, offsets) of a complete entry; ValueError if it is damaged."""
    damaged = f"token cache entry {entry} is damaged or of another format; delete it to rebuild"
    try:
        meta = json.loads((entry / "meta.json").read_text())
        dtype, n = np.dtype(meta["dtype"]), int(meta["num_tokens"])
        offsets = np.load(entry / "offsets.npy")
        whole = (meta.keys() == META_KEYS and meta["format"] == FORMAT and n > 0
                 and (entry / "tokens.bin").stat().st_size == n * dtype.itemsize
                 and offsets.shape == (meta["num_documents"] + 1,)
                 and offsets[0] == 0 and offsets[-1] == n and bool(np.all(np.diff(offsets) >= 0)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{damaged} ({e})") from e
    if not whole:
        raise ValueError(damaged)
    tokens = np.memmap(entry / "tokens.bin", dtype=dtype, mode="r", shape=(n,))
    return meta, tokens, offsets
