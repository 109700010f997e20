"""The token cache: where a tokenised corpus lives, what keys it, and how it is written.

An entry is a folder `<cache_dir>/<kind>-<key>/` holding
  tokens.bin    every document's token ids back to back, raw uint16 (vocab <= 65535) or uint32
  offsets.npy   int64, num_documents + 1 entries: document i is tokens[offsets[i]:offsets[i+1]]
  meta.json     vocab size, dtype, counts, skip counts, tokenizer; written last

The key hashes the format version, the source kind and text field, `skip_bad`, the
tokenizer's identity (its file's bytes) and the content digest (blake2b) of every input file
in reading order (of an `hf-dataset:` source, every file the dataset is made of): what the
tokens are a function of. Paths are not in it, so a copy of the
corpus at another path reuses the entry (reported under the path the user gave), and any
change to a file's bytes misses it.

Hashing a corpus is a full read, so each file's digest is memoised in a sidecar,
`<cache_dir>/hashes/<digest of the source spec>.json`, under the file's stamp: path, size,
mtime_ns, ctime_ns and inode. A file whose stamp is unchanged is not read again, so only the
first build reads the corpus twice (hash, then tokenise) and later ones just stat it. The
ctime is what makes trusting a stamp safe: an edit can restore the size and the mtime
(`touch -r`, `os.utime`, some copy tools) but not the ctime, which the kernel sets to the
current time on every change and which no system call sets back. The stamp is taken before
the file is read, so a write during hashing moves the ctime too. A file whose ctime is within
RACY_NS of the run is hashed but not memoised: a timestamp is only as fine as the
filesystem's clock tick (up to a second on some), and a same-size write within the tick of the
stamp would keep it. The memo only saves reads: losing it, or failing to write it, costs a
re-hash, never a wrong entry.

Writing is atomic: an entry is built in a hidden temporary folder beside it and renamed into
place, so readers see a whole entry or none, and a crash leaves only a temporary folder that
nothing reads. When two processes (ranks) build the same entry, the first rename wins and the
other process uses it. The memo is replaced atomically too: concurrent ranks each write a
whole memo and the last one stays.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import time
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
    """(path, size, mtime_ns) per file: what the fingerprint of a `tokens:X.npy` file sees."""
    stamps = []
    for p in paths:
        st = os.stat(p)
        stamps.append((p, st.st_size, st.st_mtime_ns))
    return stamps


def digest(value: object) -> str:
    """sha256 of a JSON-serialisable value, canonically encoded."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


RACY_NS = 2_000_000_000
"""A file whose ctime is this recent is hashed but not memoised: coarser than the timestamp
tick of common filesystems (ext4, xfs, tmpfs: a kernel tick of a few ms; ext3, some network
filesystems: 1 s)."""
UNREADABLE = "unreadable"
"""Stands in for the digest of a file that cannot be read: the reader reports that file (an
error, or a skip under skip_bad), and it is hashed once it can be read."""


def memo_path(cache_dir: Path, source: str) -> Path:
    """The digest memo of one source spec: it holds exactly that source's files, so it does
    not grow with files that have since gone."""
    return cache_dir / "hashes" / f"{digest(source)[:24]}.json"


def content_digests(paths: tuple[str, ...] | list[str], memo: Path) -> list[str]:
    """Each file's content digest, in order, reading only files whose stamp `memo` lacks (see
    the module doc for why a stamp with the ctime is safe to trust)."""
    known = _load_memo(memo)
    settled_before = time.time_ns() - RACY_NS
    settled: dict[str, str] = {}
    digests = []
    for path in paths:
        st = os.stat(path)  # before reading: a write after this moves the ctime
        stamp = json.dumps([path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino])
        found = known.get(stamp) or _hash_file(path)
        if found != UNREADABLE and st.st_ctime_ns < settled_before:
            settled[stamp] = found
        digests.append(found)
    if settled != known:
        _save_memo(memo, settled)
    return digests


def _hash_file(path: str) -> str:
    try:
        with open(path, "rb") as f:  # file_digest reads in chunks: no whole file in memory
            return hashlib.file_digest(f, lambda: hashlib.blake2b(digest_size=32)).hexdigest()
    except OSError:
        return UNREADABLE


def _load_memo(memo: Path) -> dict[str, str]:
    """The memo's stamp -> digest pairs; none when it is missing or unreadable, since anything
    the memo lacks is just hashed."""
    try:
        pairs = json.loads(memo.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(pairs, dict):
        return {}
    return {stamp: d for stamp, d in pairs.items() if isinstance(d, str)}


def _save_memo(memo: Path, pairs: dict[str, str]) -> None:
    """Replace the memo atomically. A memo that cannot be written (a read-only shared cache)
    costs only re-hashing next time, so that is not an error."""
    tmp = memo.with_name(f".tmp-{memo.name}-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(pairs))
        os.replace(tmp, memo)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


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
