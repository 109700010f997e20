"""Tokenizers of the data pipeline: byte-level (the default) or a Hugging Face `tokenizers` file.

Byte-level needs nothing and its vocab (256) is the `tiny` model's, so `ballast train` works on
any machine out of the box; a `tokenizer.json` brings a real subword vocabulary. Both turn a
batch of texts into token-id arrays and carry an `identity` that changes whenever their output
could, which is what keys the token cache.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol

import numpy as np


class Tokenizer(Protocol):
    name: str
    """For reports: "bytes" or the tokenizer file's name."""
    identity: str
    """Changes whenever the ids this tokenizer emits could change; part of the cache key."""
    vocab_size: int
    """Every id it emits is below this."""

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """One 1-D integer array of token ids per text."""


class ByteTokenizer:
    """One token per UTF-8 byte: ids 0..255, lossless, no special tokens.

    Documents need no separator token: the runtime packs sequences with attention masked per
    sequence and positions restarting, so a document's start is known without one.
    """

    name = identity = "bytes"
    vocab_size = 256

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    @staticmethod
    def decode(ids: np.ndarray) -> str:
        """The text of byte ids; the round trip `decode(encode(t)) == t` is exact."""
        return np.asarray(ids, dtype=np.uint8).tobytes().decode("utf-8")


class HFTokenizer:
    """A Hugging Face `tokenizers` JSON file (`Tokenizer.from_file`).

    Special tokens are added as the file's post-processor says (`add_special_tokens=True`): the
    file describes what the model it belongs to expects. The identity hashes the file's bytes
    and the library version, since either can change the ids.
    """

    def __init__(self, path: str) -> None:
        import tokenizers

        try:  # load the bytes that are hashed, so identity and ids cannot disagree
            data = Path(path).read_bytes()
            self._tok = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # OSError, UnicodeDecodeError, or the library's plain Exception
            raise ValueError(f"tokenizer {path}: cannot load a Hugging Face tokenizers JSON "
                             f"file ({e})") from e
        self.name = Path(path).name
        self.identity = (f"hf:{hashlib.sha256(data).hexdigest()}"
                         f":tokenizers-{tokenizers.__version__}")
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        if self.vocab_size < 1:
            raise ValueError(f"tokenizer {path}: empty vocabulary")

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        encodings = self._tok.encode_batch(texts, add_special_tokens=True)
        return [np.asarray(e.ids, dtype=np.int64) for e in encodings]


def load_tokenizer(spec: str | None) -> Tokenizer:
    """None or "bytes": the byte-level tokenizer; anything else: a tokenizers JSON file."""
    if spec is None or spec == "bytes":
        return ByteTokenizer()
    return HFTokenizer(spec)


def check_vocab(vocab_size: int, model_vocab: int, model_name: str = "the model") -> None:
    """ValueError unless every token id (< vocab_size) has a row in the model's embedding.

    The trainer calls it before building anything: an id past the embedding would otherwise
    fail deep inside a forward pass (or silently index garbage on some devices).
    """
    if vocab_size > model_vocab:
        raise ValueError(f"tokenizer vocab {vocab_size} exceeds {model_name}'s vocab "
                         f"{model_vocab}: use a model with a vocab of at least {vocab_size} "
                         f"or a smaller tokenizer")
