"""build_corpus: a source spec to a TokenCorpus, tokenising once into the cache."""
from __future__ import annotations

import contextlib
import dataclasses
import os
from collections import Counter
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numpy as np
from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)

from .cache import (FORMAT, content_digests, default_cache_dir, digest, memo_path, token_dtype,
                    write_entry)
from .corpus import TokenCorpus, load_tokens, open_entry
from .sources import parse_source, read_documents
from .text_source import Bad, Doc, TextSource
from .tokenizer import Tokenizer, load_tokenizer

ENCODE_DOCS = 1024
ENCODE_CHARS = 1 << 22
"""A batch of documents goes to the tokenizer at once (Hugging Face's encode_batch runs it on
all cores); these bound its size, and so the memory a batch of long documents holds."""


def build_corpus(source: str, tokenizer: str | None = None, cache_dir: str | None = None,
                 text_field: str = "text", skip_bad: bool = False,
                 progress: bool = True) -> TokenCorpus:
    """The corpus `source` names, tokenised by `tokenizer` (None: bytes; else a tokenizers
    JSON file), from the cache under `cache_dir` (default ~/.cache/ballast) when it holds it.

    Malformed input is a ValueError naming the file and line, or with `skip_bad` is skipped and
    counted (`corpus.skipped`, `describe()`). `progress` shows a bar on stderr while tokenising.
    """
    tok = load_tokenizer(tokenizer)
    kind, _, arg = source.partition(":")
    if kind == "tokens" and arg:
        return load_tokens(arg, tok if tokenizer is not None else None)
    src = parse_source(source, text_field)
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    contents = content_digests(src.files, memo_path(root, src.spec))
    key = digest([FORMAT, src.kind, src.text_field, skip_bad, tok.identity, contents])
    entry = root / f"{src.kind}-{key[:24]}"
    if entry.exists():  # entries appear whole (renamed into place): one without meta is damaged
        return _open(entry, src, built=False)
    total = sum(os.path.getsize(p) for p in src.files) if progress else None
    write_entry(entry, lambda tmp: _tokenise(src, tok, key, skip_bad, total, tmp))
    return _open(entry, src, built=True)


def _open(entry: Path, src: TextSource, built: bool) -> TokenCorpus:
    """The entry, named by the source the user gave: the key holds contents, not paths, so the
    entry may have been built from a copy of these files elsewhere."""
    return dataclasses.replace(open_entry(entry, built), name=src.spec)


def _tokenise(src: TextSource, tok: Tokenizer, key: str, skip_bad: bool, total: int | None,
              out: Path) -> dict:
    """Write tokens.bin and offsets.npy of every document of `src` into `out`; the meta.
    `total` is the input's size in bytes for the progress bar, None for no bar."""
    dtype = token_dtype(tok.vocab_size)
    offsets, skipped = [0], Counter()
    pending: list[str] = []

    def flush(f: BinaryIO) -> None:
        if not pending:
            return
        for ids in tok.encode_batch(pending):
            if ids.size and int(ids.max()) >= tok.vocab_size:
                raise ValueError(f"tokenizer {tok.name} emitted id {int(ids.max())}, outside "
                                 f"its own vocab of {tok.vocab_size}")
            f.write(ids.astype(dtype, copy=False).tobytes())
            offsets.append(offsets[-1] + ids.size)
        pending.clear()

    with open(out / "tokens.bin", "wb") as f, _progress_bar(src.kind, total) as advance:
        chars = 0
        for item in read_documents(src):
            advance(item.nbytes)
            if isinstance(item, Bad):
                if not skip_bad:
                    raise ValueError(f"{item.where}: {item.reason} (skip_bad=True / --skip-bad "
                                     f"skips malformed input and counts it)")
                skipped[item.kind] += 1
                continue
            assert isinstance(item, Doc)
            pending.append(item.text)
            chars += len(item.text)
            if len(pending) >= ENCODE_DOCS or chars >= ENCODE_CHARS:
                flush(f)
                chars = 0
        flush(f)
    if offsets[-1] == 0:
        why = f"all {sum(skipped.values())} inputs were malformed" if skipped else "no tokens"
        raise ValueError(f"{src.spec}: no documents to train on ({why})")
    np.save(out / "offsets.npy", np.array(offsets, dtype=np.int64))
    return {"format": FORMAT, "key": key, "source": src.spec, "tokenizer": tok.name,
            "tokenizer_identity": tok.identity, "vocab_size": tok.vocab_size,
            "dtype": dtype.name, "num_documents": len(offsets) - 1, "num_tokens": offsets[-1],
            "skipped": dict(skipped)}


@contextlib.contextmanager
def _progress_bar(label: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A byte-progress bar on stderr, cleared when done (none if total is None); yields
    `advance(nbytes)`, which redraws about once per MiB rather than once per JSONL line."""
    columns = (TextColumn(f"tokenising {label}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True,
                  disable=total is None) as bar:
        task = bar.add_task("tokenise", total=total)
        waiting = 0

        def advance(nbytes: int) -> None:
            nonlocal waiting
            waiting += nbytes
            if waiting >= 1 << 20:
                bar.advance(task, waiting)
                waiting = 0

        yield advance
