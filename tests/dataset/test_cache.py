"""Data pipeline: the token cache is reused, invalidated when inputs change, and atomic."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import ballast.dataset.build as build_module
import ballast.dataset.cache as cache_module
from ballast.dataset import ByteTokenizer, build_corpus
from test_sources import word_level_tokenizer  # this folder's test_sources.py (pytest puts the folder on sys.path)


def build(source: str, cache: Path, **kw):
    return build_corpus(source, cache_dir=str(cache), **{"progress": False} | kw)


@pytest.fixture
def data(tmp_path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.txt").write_text("first document")
    (folder / "b.txt").write_text("second document, a little longer")
    return folder


def forbid_tokenising(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("tokenised again")
    monkeypatch.setattr(build_module, "_tokenise", fail)


def entries(cache: Path) -> list[str]:
    """Names in the cache dir but the digest memos."""
    return sorted(p.name for p in cache.iterdir() if p.name != "hashes")


def count_hashing(monkeypatch) -> list[str]:
    """The files hashed from now on (the memo spares the others)."""
    hashed = []
    real = cache_module._hash_file

    def counting(path):
        hashed.append(Path(path).name)
        return real(path)
    monkeypatch.setattr(cache_module, "_hash_file", counting)
    return hashed


def edit_in_place(path: Path, text: str) -> None:
    """Rewrite `path` with `text` of the same size and put its mtime back, as `touch -r` does.
    Repeats until the ctime moves: within one filesystem clock tick it would not, which
    RACY_NS guards against and the tests that edit turn off."""
    before = os.stat(path)
    assert len(text.encode()) == before.st_size
    while os.stat(path).st_ctime_ns == before.st_ctime_ns:
        time.sleep(0.01)
        path.write_text(text)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_second_build_is_a_cache_hit(tmp_path, data, monkeypatch, capsys):
    cache = tmp_path / "cache"
    first = build(f"folder:{data}", cache, progress=True)
    assert capsys.readouterr().out == ""  # the bar is on stderr (and cleared when done)
    assert first.built and Path(first.path).parent == cache
    stamp = os.stat(Path(first.path) / "tokens.bin").st_mtime_ns
    forbid_tokenising(monkeypatch)
    second = build(f"folder:{data}", cache)
    assert not second.built and second.path == first.path
    assert second.fingerprint == first.fingerprint
    assert os.stat(Path(first.path) / "tokens.bin").st_mtime_ns == stamp
    assert np.array_equal(second.tokens, first.tokens)
    assert isinstance(second.tokens, np.memmap)
    assert "read from" in second.describe() and "tokenised into" in first.describe()


def test_changes_to_inputs_or_tokenizer_rebuild(tmp_path, data):
    cache = tmp_path / "cache"
    first = build(f"folder:{data}", cache)
    (data / "a.txt").write_text("first document, edited")
    edited = build(f"folder:{data}", cache)
    assert edited.built and edited.fingerprint != first.fingerprint
    assert ByteTokenizer.decode(edited.document(0)) == "first document, edited"
    (data / "c.txt").write_text("a new file")
    assert build(f"folder:{data}", cache).num_documents == 3
    tok = word_level_tokenizer(tmp_path / "tok.json", ["first", "document"])
    words = build(f"folder:{data}", cache, tokenizer=str(tok))
    assert words.built and words.vocab_size == 3
    word_level_tokenizer(tmp_path / "tok.json", ["document", "first"])  # same name, new ids
    swapped = build(f"folder:{data}", cache, tokenizer=str(tok))
    assert swapped.built and swapped.document(0).tolist() != words.document(0).tolist()


def test_a_copy_elsewhere_reuses_the_entry(tmp_path, data, monkeypatch):
    """The key is the files' contents: a copy with new paths, inodes and mtimes is a hit."""
    cache = tmp_path / "cache"
    first = build(f"folder:{data}", cache)
    copy = tmp_path / "copy" / "data"
    shutil.copytree(data, copy, copy_function=shutil.copyfile)  # new mtimes too
    forbid_tokenising(monkeypatch)
    again = build(f"folder:{copy}", cache)
    assert not again.built and again.path == first.path
    assert again.fingerprint == first.fingerprint
    assert again.name == f"folder:{copy}"  # reported as the source the user named


def test_unchanged_files_are_not_read_again(tmp_path, data, monkeypatch):
    monkeypatch.setattr(cache_module, "RACY_NS", 0)  # the files were written just now
    cache = tmp_path / "cache"
    build(f"folder:{data}", cache)
    hashed = count_hashing(monkeypatch)
    assert not build(f"folder:{data}", cache).built
    assert hashed == []


def test_files_changed_just_now_are_not_memoised(tmp_path, data, monkeypatch):
    """Within RACY_NS a same-size write could keep the stamp (one clock tick): hash again."""
    cache = tmp_path / "cache"
    build(f"folder:{data}", cache)
    hashed = count_hashing(monkeypatch)
    assert not build(f"folder:{data}", cache).built
    assert hashed == ["a.txt", "b.txt"]


def test_an_edit_keeping_size_and_mtime_rebuilds(tmp_path, data, monkeypatch):
    monkeypatch.setattr(cache_module, "RACY_NS", 0)
    cache = tmp_path / "cache"
    first = build(f"folder:{data}", cache)
    edit_in_place(data / "a.txt", "FIRST DOCUMENT")
    hashed = count_hashing(monkeypatch)
    edited = build(f"folder:{data}", cache)
    assert hashed == ["a.txt"]  # the ctime moved; b.txt's stamp did not
    assert edited.built and edited.fingerprint != first.fingerprint
    assert ByteTokenizer.decode(edited.document(0)) == "FIRST DOCUMENT"


def test_tokenizer_edit_keeping_size_and_mtime_rebuilds(tmp_path, data, monkeypatch):
    monkeypatch.setattr(cache_module, "RACY_NS", 0)
    cache = tmp_path / "cache"
    tok = word_level_tokenizer(tmp_path / "tok.json", ["first", "second"])
    words = build(f"folder:{data}", cache, tokenizer=str(tok))
    swapped = word_level_tokenizer(tmp_path / "swapped.json", ["second", "first"]).read_text()
    edit_in_place(tok, swapped)  # same bytes count, ids of "first" and "second" swapped
    rebuilt = build(f"folder:{data}", cache, tokenizer=str(tok))
    assert rebuilt.built and rebuilt.fingerprint != words.fingerprint
    assert words.document(0).tolist() == [1, 0] and rebuilt.document(0).tolist() == [2, 0]


@pytest.mark.parametrize("damage", ['{"truncated', '["a", "list"]', '{"stamp": 3}'])
def test_a_damaged_memo_is_ignored(tmp_path, data, monkeypatch, damage):
    """The memo only saves reads: one that makes no sense means hashing everything again."""
    monkeypatch.setattr(cache_module, "RACY_NS", 0)
    cache = tmp_path / "cache"
    first = build(f"folder:{data}", cache)
    (memo,) = (cache / "hashes").iterdir()
    memo.write_text(damage)
    hashed = count_hashing(monkeypatch)
    again = build(f"folder:{data}", cache)
    assert not again.built and again.path == first.path
    assert hashed == ["a.txt", "b.txt"] and len(json.loads(memo.read_text())) == 2


def test_a_file_hashing_cannot_read_is_left_to_the_reader(tmp_path, data, monkeypatch):
    """Hashing does not raise on an unreadable file (the reader reports it, or skips it under
    skip_bad), and does not memoise it: it is hashed once it can be read."""
    monkeypatch.setattr(cache_module, "RACY_NS", 0)

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    with monkeypatch.context() as m:
        m.setattr(cache_module, "open", denied, raising=False)  # root reads through chmod 000
        corpus = build(f"folder:{data}", tmp_path / "cache")
    assert corpus.num_documents == 2
    assert not (tmp_path / "cache" / "hashes").exists()
    hashed = count_hashing(monkeypatch)
    assert build(f"folder:{data}", tmp_path / "cache").built  # now readable: a new key
    assert hashed == ["a.txt", "b.txt"]


def test_skip_bad_is_part_of_the_key(tmp_path, data):
    (data / "empty.txt").write_bytes(b"")
    cache = tmp_path / "cache"
    assert build(f"folder:{data}", cache, skip_bad=True).skipped == 1
    with pytest.raises(ValueError, match="empty file"):  # not served the skipping build's entry
        build(f"folder:{data}", cache)


def test_failed_build_leaves_nothing_and_partial_temp_is_ignored(tmp_path, data, monkeypatch):
    cache = tmp_path / "cache"
    entry_name = Path(build(f"folder:{data}", tmp_path / "elsewhere").path).name

    def crash(self, texts):
        raise RuntimeError("killed mid-way")
    with monkeypatch.context() as m:
        m.setattr(ByteTokenizer, "encode_batch", crash)
        with pytest.raises(RuntimeError):
            build(f"folder:{data}", cache)
    assert entries(cache) == []  # the temporary folder was removed
    # A crash that could not clean up (SIGKILL) leaves a partial temporary folder behind.
    partial = cache / f".tmp-{entry_name}-12345-deadbeef"
    partial.mkdir()
    (partial / "tokens.bin").write_bytes(b"\x01\x02")
    corpus = build(f"folder:{data}", cache)
    assert corpus.built and Path(corpus.path).name == entry_name
    assert ByteTokenizer.decode(corpus.document(0)) == "first document"
    assert entries(cache) == sorted([entry_name, partial.name])


def test_concurrent_builder_wins_the_rename(tmp_path, data, monkeypatch):
    """Two ranks building the same entry: the one whose rename fails uses the winner's."""
    cache = tmp_path / "cache"
    real = build_module._tokenise

    def race(src, tok, key, skip_bad, total, out):
        meta = real(src, tok, key, skip_bad, total, out)
        monkeypatch.setattr(build_module, "_tokenise", real)
        build(f"folder:{data}", cache)  # the other rank finishes first
        return meta
    monkeypatch.setattr(build_module, "_tokenise", race)
    corpus = build(f"folder:{data}", cache)
    assert corpus.num_documents == 2
    assert entries(cache) == [Path(corpus.path).name]


def test_damaged_entry_is_a_clear_error(tmp_path, data):
    corpus = build(f"folder:{data}", tmp_path / "cache")
    meta_path = Path(corpus.path) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps(meta | {"num_tokens": meta["num_tokens"] + 1}))
    with pytest.raises(ValueError, match="damaged.*delete it to rebuild"):
        build(f"folder:{data}", tmp_path / "cache")
    meta_path.unlink()
    with pytest.raises(ValueError, match="damaged.*delete it to rebuild"):
        build(f"folder:{data}", tmp_path / "cache")


def test_cache_entry_is_a_tokens_source(tmp_path, data):
    corpus = build(f"folder:{data}", tmp_path / "cache")
    again = build(f"tokens:{corpus.path}", tmp_path / "unused")
    assert again.num_tokens == corpus.num_tokens and again.vocab_size == 256
    assert again.fingerprint == corpus.fingerprint
    tok = word_level_tokenizer(tmp_path / "tok.json", ["first"])
    with pytest.raises(ValueError, match="tokenised with bytes, not with tok.json"):
        build(f"tokens:{corpus.path}", tmp_path / "unused", tokenizer=str(tok))
