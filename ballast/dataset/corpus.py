"""TokenCorpus: a tokenised corpus, memory-mapped, and the `tokens:PATH` source that opens one.

`tokens:PATH` takes data that is already tokenised, in one of two forms:
  a cache entry folder (tokens.bin, offsets.npy, meta.json; see cache.py), e.g. one copied
      from another machine: it knows its tokenizer and vocab;
  X.npy, a 1-D integer array of token ids, with X.offsets.npy beside it: num_documents + 1
      non-decreasing int offsets from 0 to len(X), document i being X[offsets[i]:offsets[i+1]].
      Such a file does not know its tokenizer: its vocab is the given tokenizer's, else the
      largest id + 1 (all that the model's vocab check needs).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .cache import FORMAT, digest, file_stamps, read_entry
from .tokenizer import Tokenizer


@dataclass(eq=False)
class TokenCorpus:
    """Documents as token ids: `document(i)` is a view into one memory-mapped array, so a
    corpus larger than RAM costs only the pages a step touches."""

    name: str
    """Canonical source spec, for reports."""
    tokens: np.ndarray
    offsets: np.ndarray
    """int64, num_documents + 1: document i is tokens[offsets[i]:offsets[i+1]]."""
    vocab_size: int
    tokenizer: str
    """The tokenizer's name, for reports."""
    tokenizer_identity: str | None
    """See Tokenizer.identity; None for a .npy token file read without a tokenizer."""
    fingerprint: str
    """Changes whenever the documents could; a BatchStream's state is only valid for it."""
    path: str
    """Cache entry or token file this corpus reads."""
    built: bool
    """True when this build tokenised the inputs, False when it opened existing tokens."""
    skipped_by_kind: dict[str, int] = field(default_factory=dict)
    """Malformed inputs skipped under skip_bad, by kind ("bad JSON": 2, ...)."""

    def __post_init__(self) -> None:
        assert self.offsets.ndim == 1 and self.offsets[0] == 0
        assert self.offsets[-1] == self.tokens.size

    @property
    def num_documents(self) -> int:
        return self.offsets.size - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def skipped(self) -> int:
        return sum(self.skipped_by_kind.values())

    def document(self, i: int) -> np.ndarray:
        if not 0 <= i < self.num_documents:
            raise IndexError(f"document {i} out of range 0..{self.num_documents - 1}")
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    def document_lengths(self) -> np.ndarray:
        """Tokens per document (int64): the corpus as a length distribution."""
        return np.diff(self.offsets)

    def describe(self) -> str:
        """One paragraph for the trainer's log: what was read, how, and what was skipped."""
        lengths = self.document_lengths()
        text = (f"{self.name}: {self.num_documents:,} documents, {self.num_tokens:,} tokens "
                f"(tokenizer {self.tokenizer}, vocab {self.vocab_size:,}; tokens per document "
                f"mean {lengths.mean():,.0f}, median {np.median(lengths):,.0f}, "
                f"max {lengths.max():,})")
        if self.skipped:
            kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.skipped_by_kind.items()))
            text += f"; skipped {self.skipped} malformed input{'s' * (self.skipped != 1)} ({kinds})"
        return text + f"; {'tokenised into' if self.built else 'read from'} {self.path}"


def open_entry(entry: Path, built: bool) -> TokenCorpus:
    meta, tokens, offsets = read_entry(entry)
    return TokenCorpus(meta["source"], tokens, offsets, meta["vocab_size"], meta["tokenizer"],
                       meta["tokenizer_identity"], meta["key"], str(entry), built, meta["skipped"])


def load_tokens(path_arg: str, tokenizer: Tokenizer | None) -> TokenCorpus:
    """The `tokens:PATH` source; `tokenizer` is the one the user named, if any."""
    path = Path(path_arg).expanduser().resolve()
    if (path / "meta.json").is_file():
        corpus = open_entry(path, built=False)
        if tokenizer is not None and tokenizer.identity != corpus.tokenizer_identity:
            raise ValueError(f"tokens:{path} was tokenised with {corpus.tokenizer}, "
                             f"not with {tokenizer.name}")
        return corpus
    if path.suffix != ".npy" or not path.is_file():
        raise ValueError(f"tokens:{path}: expected a token cache folder (with meta.json) or "
                         f"a .npy file of token ids")
    index = path.with_suffix(".offsets.npy")
    if not index.is_file():
        raise ValueError(f"tokens:{path}: the document index {index} is missing "
                         f"(num_documents + 1 offsets into the token array)")
    try:
        tokens = np.load(path, mmap_mode="r")
        offsets = np.load(index)
    except (OSError, ValueError) as e:
        raise ValueError(f"tokens:{path}: cannot load ({e})") from e
    _check_token_arrays(path, index, tokens, offsets)
    offsets = offsets.astype(np.int64)
    top = int(tokens.max()) + 1
    vocab = top if tokenizer is None else tokenizer.vocab_size
    if top > vocab:
        raise ValueError(f"tokens:{path}: token id {top - 1} is outside the vocab {vocab} of "
                         f"tokenizer {tokenizer.name}")
    name = "unknown" if tokenizer is None else tokenizer.name
    identity = None if tokenizer is None else tokenizer.identity
    key = digest([FORMAT, "tokens", identity, file_stamps([str(path), str(index)])])
    return TokenCorpus(f"tokens:{path}", tokens, offsets, vocab, name, identity, key, str(path),
                       False)


def _check_token_arrays(path: Path, index: Path, tokens: np.ndarray, offsets: np.ndarray) -> None:
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu" or tokens.size == 0:
        raise ValueError(f"tokens:{path}: expected a non-empty 1-D integer array, got "
                         f"{tokens.dtype} of shape {tokens.shape}")
    if tokens.dtype.kind == "i" and tokens.min() < 0:
        raise ValueError(f"tokens:{path}: negative token id {int(tokens.min())}")
    if (offsets.ndim != 1 or offsets.dtype.kind not in "iu" or offsets.size < 2
            or offsets[0] != 0 or offsets[-1] != tokens.size
            or np.any(np.diff(offsets.astype(np.int64)) < 0)):
        raise ValueError(f"{index}: expected non-decreasing integer offsets from 0 to "
                         f"{tokens.size} (num_documents + 1 of them)")
