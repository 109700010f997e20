"""Data pipeline: reading folders, JSONL and Parquet, tokenizers, malformed input."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from ballast.dataset import ByteTokenizer, build_corpus, check_vocab, load_tokenizer
from ballast.vocabulary.model_shape import get_model_shape

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog",
         "naïve café ∑ 🚀\nline two"]


def texts_of(corpus) -> list[str]:
    return [ByteTokenizer.decode(corpus.document(i)) for i in range(corpus.num_documents)]


def build(source: str, tmp_path: Path, **kw):
    return build_corpus(source, cache_dir=str(tmp_path / "cache"), **{"progress": False} | kw)


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    for text in TEXTS + ["", "\x00\x7f", "\U0010ffff"]:
        (ids,) = tok.encode_batch([text])
        assert ids.max(initial=0) < tok.vocab_size == 256
        assert ByteTokenizer.decode(ids) == text
        assert ids.size == len(text.encode("utf-8"))


def test_folder_recursive_sorted_hidden_skipped(tmp_path):
    data = tmp_path / "data"
    (data / "b" / "c").mkdir(parents=True)
    (data / ".git").mkdir()
    (data / "b" / "c" / "z.txt").write_text(TEXTS[2], encoding="utf-8")
    (data / "b" / "a.md").write_text(TEXTS[1])
    (data / "a.txt").write_text(TEXTS[0])
    (data / ".hidden").write_text("not data")
    (data / ".git" / "HEAD").write_text("not data")
    corpus = build(f"folder:{data}", tmp_path)
    assert texts_of(corpus) == TEXTS  # a.txt, b/a.md, b/c/z.txt
    assert corpus.vocab_size == 256 and corpus.tokens.dtype == np.uint16
    assert corpus.num_tokens == sum(len(t.encode()) for t in TEXTS)
    assert corpus.skipped == 0 and corpus.name == f"folder:{data.resolve()}"
    assert "3 documents" in corpus.describe()


def test_jsonl_file_and_folder_with_text_field(tmp_path):
    (tmp_path / "d").mkdir()
    write_jsonl(tmp_path / "d" / "1.jsonl", [json.dumps({"body": t, "id": i})
                                             for i, t in enumerate(TEXTS[:2])] + ["   "])
    write_jsonl(tmp_path / "d" / "2.jsonl", [json.dumps({"body": TEXTS[2]})])
    (tmp_path / "d" / "notes.txt").write_text("not a .jsonl file: not read")
    assert texts_of(build(f"jsonl:{tmp_path / 'd'}", tmp_path, text_field="body")) == TEXTS
    one = build(f"jsonl:{tmp_path / 'd' / '2.jsonl'}", tmp_path, text_field="body")
    assert texts_of(one) == TEXTS[2:]


def test_parquet(tmp_path):
    pq.write_table(pa.table({"text": TEXTS[:2], "n": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": TEXTS[2:]}), tmp_path / "b.parquet")
    assert texts_of(build(f"parquet:{tmp_path}", tmp_path)) == TEXTS


def word_level_tokenizer(path: Path, words: list[str]) -> Path:
    vocab = {"[UNK]": 0} | {w: i + 1 for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def test_hf_tokenizer_end_to_end(tmp_path):
    from ballast.dataset import BatchStream

    path = word_level_tokenizer(tmp_path / "tok.json", ["hello", "world", "the", "fox"])
    write_jsonl(tmp_path / "d.jsonl", [json.dumps({"text": t}) for t in TEXTS])
    corpus = build(f"jsonl:{tmp_path / 'd.jsonl'}", tmp_path, tokenizer=str(path))
    assert corpus.vocab_size == 5 and corpus.tokenizer == "tok.json"
    assert corpus.document(0).tolist() == [1, 2]
    assert corpus.document(1).tolist() == [3, 0, 0, 4, 0, 0, 3, 0, 0]
    batch = BatchStream(corpus, tokens_per_step=100, max_len=4, seed=0).next_batch()
    assert sorted(batch.lengths) == [1, 1, 4, 4, 4] and batch.num_tokens == 14
    check_vocab(corpus.vocab_size, get_model_shape("tiny").vocab)


def test_vocab_check_names_both_numbers(tmp_path):
    words = [f"w{i}" for i in range(299)]
    tok = load_tokenizer(str(word_level_tokenizer(tmp_path / "big.json", words)))
    assert tok.vocab_size == 300
    with pytest.raises(ValueError, match=r"vocab 300 exceeds tiny's vocab 256"):
        check_vocab(tok.vocab_size, 256, "tiny")
    check_vocab(256, 256)
    with pytest.raises(ValueError, match="cannot load"):
        load_tokenizer(str(tmp_path / "missing.json"))


# (what, kind of source, files to write {name: bytes}, error pattern, skip kind, good docs)
GOOD = json.dumps({"text": "good"}).encode() + b"\n"
MALFORMED = [
    ("bad JSON line", "jsonl", {"x.jsonl": GOOD + b'{"text": "a",\n' + GOOD},
     r"x\.jsonl line 2: invalid JSON", "bad JSON", 2),
    ("missing field", "jsonl", {"x.jsonl": GOOD + GOOD + b'{"body": "a"}\n'},
     r"x\.jsonl line 3: no 'text' field \(keys: 'body'\)", "missing field", 2),
    ("non-string text", "jsonl", {"x.jsonl": b'{"text": 5}\n' + GOOD},
     r"x\.jsonl line 1: field 'text' is int, not a string", "not a string", 1),
    ("not an object", "jsonl", {"x.jsonl": GOOD + b'["text"]\n'},
     r"x\.jsonl line 2: expected a JSON object", "not an object", 1),
    ("empty jsonl", "jsonl", {"a.jsonl": b"", "b.jsonl": GOOD},
     r"a\.jsonl: empty file", "empty", 1),
    ("jsonl not UTF-8", "jsonl", {"x.jsonl": GOOD + b'{"text": "\xff"}\n'},
     r"x\.jsonl line 2: not UTF-8 \(byte 0xff", "not UTF-8", 1),
    ("empty file", "folder", {"a.txt": b"", "b.txt": b"text"},
     r"a\.txt: empty file", "empty", 1),
    ("binary file", "folder", {"a.txt": b"text", "b.bin": b"\x89PNG\r\n\x1a\nab\ncd\x00\x01"},
     r"b\.bin line 4: not a text file \(NUL byte\)", "not text", 1),
    ("not UTF-8", "folder", {"a.txt": b"one\ntwo \xe9t\xe9\n"},
     r"a\.txt line 2: not UTF-8 \(byte 0xe9", "not UTF-8", 0),
]


@pytest.mark.parametrize("what,kind,files,error,skip_kind,good", MALFORMED,
                         ids=[m[0] for m in MALFORMED])
def test_malformed_input_errors_or_is_skipped(tmp_path, what, kind, files, error, skip_kind, good):
    data = tmp_path / "data"
    data.mkdir()
    for name, content in files.items():
        (data / name).write_bytes(content)
    with pytest.raises(ValueError, match=error + r".*skip_bad"):
        build(f"{kind}:{data}", tmp_path)
    if not good:
        with pytest.raises(ValueError, match=r"no documents to train on \(all 1 inputs"):
            build(f"{kind}:{data}", tmp_path, skip_bad=True)
        return
    corpus = build(f"{kind}:{data}", tmp_path, skip_bad=True)
    assert corpus.num_documents == good
    assert corpus.skipped == 1 and corpus.skipped_by_kind == {skip_kind: 1}
    assert f"skipped 1 malformed input ({1} {skip_kind})" in corpus.describe()
    again = build(f"{kind}:{data}", tmp_path, skip_bad=True)  # the counts survive the cache
    assert not again.built and again.skipped_by_kind == {skip_kind: 1}


def test_parquet_malformed(tmp_path):
    pq.write_table(pa.table({"body": ["a"]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": ["b", None, ""]}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "c.parquet")
    (tmp_path / "d.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=r"a\.parquet: no column 'text' \(columns: 'body'\)"):
        build(f"parquet:{tmp_path}", tmp_path)
    with pytest.raises(ValueError, match=r"b\.parquet row 2: column 'text' is null"):
        build(f"parquet:{tmp_path / 'b.parquet'}", tmp_path)
    corpus = build(f"parquet:{tmp_path}", tmp_path, skip_bad=True)
    assert texts_of(corpus) == ["b"]
    assert corpus.skipped_by_kind == {"missing field": 1, "not a string": 2, "empty": 1,
                                      "not Parquet": 1}


@pytest.mark.parametrize("spec,error", [
    ("nonsense", "unknown data source"), ("folder:", "unknown data source"),
    ("folder:{tmp}/missing", "is not a folder"), ("jsonl:{tmp}", r"no \.jsonl files"),
    ("tokens:{tmp}", "expected a token cache folder"),
])
def test_bad_source_specs(tmp_path, spec, error):
    with pytest.raises(ValueError, match=error):
        build(spec.format(tmp=tmp_path), tmp_path)


def test_tokens_npy_source(tmp_path):
    np.save(tmp_path / "t.npy", np.array([5, 6, 7, 8, 9, 300], dtype=np.int32))
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "t.offsets.npy"))):
        build(f"tokens:{tmp_path / 't.npy'}", tmp_path)
    np.save(tmp_path / "t.offsets.npy", np.array([0, 2, 2, 6]))
    corpus = build(f"tokens:{tmp_path / 't.npy'}", tmp_path)
    assert corpus.num_documents == 3 and corpus.vocab_size == 301 and not corpus.built
    assert corpus.document(2).tolist() == [7, 8, 9, 300]
    with pytest.raises(ValueError, match="token id 300 is outside the vocab 256"):
        build(f"tokens:{tmp_path / 't.npy'}", tmp_path, tokenizer="bytes")
    np.save(tmp_path / "t.offsets.npy", np.array([0, 4, 2, 6]))
    with pytest.raises(ValueError, match="non-decreasing"):
        build(f"tokens:{tmp_path / 't.npy'}", tmp_path)


def test_stdlib_matches_the_simulators_lengths(tmp_path):
    from ballast.dataset.lengths import stdlib_source

    corpus = build("stdlib", tmp_path)
    assert corpus.skipped == 0
    assert sorted(corpus.document_lengths()) == sorted(stdlib_source().values)
