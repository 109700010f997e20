"""The `hf-dataset:PATH` source: save_to_disk folders and parquet/jsonl files read through
Hugging Face `datasets`, keyed in the token cache by content, malformed rows named, no network."""
from __future__ import annotations

import json
import shutil
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, DatasetDict

from ballast.dataset import SYNTAX, ByteTokenizer, build_corpus

TEXTS = ["hello world", "the quick brown fox", "naïve café 🚀"]


def texts_of(corpus) -> list[str]:
    return [ByteTokenizer.decode(corpus.document(i)) for i in range(corpus.num_documents)]


def build(source, tmp_path, **kw):
    return build_corpus(str(source), cache_dir=str(tmp_path / "cache"), **{"progress": False} | kw)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test: the source reads local files only."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def save(data: dict, path) -> str:
    Dataset.from_dict(data).save_to_disk(str(path))
    return f"hf-dataset:{path}"


def test_syntax_names_the_source():
    assert "hf-dataset:PATH" in SYNTAX


def test_saved_dataset_is_read_and_cached_by_content(tmp_path):
    spec = save({"text": TEXTS, "n": [1, 2, 3]}, tmp_path / "ds")
    corpus = build(spec, tmp_path)
    assert texts_of(corpus) == TEXTS and corpus.built and corpus.skipped == 0
    assert corpus.name == f"hf-dataset:{(tmp_path / 'ds').resolve()}"
    assert not build(spec, tmp_path).built  # the same files: the cache entry
    shutil.copytree(tmp_path / "ds", tmp_path / "copy")
    copy = build(f"hf-dataset:{tmp_path / 'copy'}", tmp_path)
    assert not copy.built and copy.path == corpus.path  # the key is the content, not the path
    shutil.rmtree(tmp_path / "ds")
    save({"text": TEXTS[::-1], "n": [1, 2, 3]}, tmp_path / "ds")
    changed = build(spec, tmp_path)
    assert changed.built and changed.path != corpus.path and texts_of(changed) == TEXTS[::-1]


def test_text_field_chooses_the_column(tmp_path):
    spec = save({"body": TEXTS, "text": ["x", "y", "z"]}, tmp_path / "ds")
    assert texts_of(build(spec, tmp_path, text_field="body")) == TEXTS
    assert texts_of(build(spec, tmp_path)) == ["x", "y", "z"]


def test_dataset_dict_reads_its_train_split(tmp_path):
    DatasetDict({"train": Dataset.from_dict({"text": TEXTS}),
                 "test": Dataset.from_dict({"text": ["held out"]})}).save_to_disk(str(tmp_path / "dd"))
    assert texts_of(build(f"hf-dataset:{tmp_path / 'dd'}", tmp_path)) == TEXTS
    DatasetDict({"a": Dataset.from_dict({"text": ["1"]}),
                 "b": Dataset.from_dict({"text": ["2"]})}).save_to_disk(str(tmp_path / "ab"))
    with pytest.raises(ValueError, match=r"ab: a DatasetDict without a 'train' split \(splits: 'a', 'b'\)"):
        build(f"hf-dataset:{tmp_path / 'ab'}", tmp_path)


def test_parquet_and_jsonl_files_through_load_dataset(tmp_path):
    data = tmp_path / "files"
    (data / "sub").mkdir(parents=True)
    (data / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:2]))
    pq.write_table(pa.table({"text": [TEXTS[2]], "id": [7]}), data / "sub" / "b.parquet")
    (data / "notes.txt").write_text("not data")
    corpus = build(f"hf-dataset:{data}", tmp_path)
    assert texts_of(corpus) == TEXTS  # a.jsonl, then sub/b.parquet; notes.txt is not a data file
    assert texts_of(build(f"hf-dataset:{data / 'sub' / 'b.parquet'}", tmp_path)) == TEXTS[2:]
    assert not build(f"hf-dataset:{data}", tmp_path).built


@pytest.mark.parametrize("make, error", [
    (lambda p: None, r"missing does not exist \(expected a folder written by datasets' save_to_disk"),
    (lambda p: (p / "missing").mkdir(), r"holds neither a dataset saved with save_to_disk"),
    (lambda p: (p / "missing").write_text("x"), r"is not a folder written by datasets' save_to_disk"),
])
def test_bad_paths(tmp_path, make, error):
    make(tmp_path)
    with pytest.raises(ValueError, match=error):
        build(f"hf-dataset:{tmp_path / 'missing'}", tmp_path)


def test_bad_rows_name_path_field_and_row(tmp_path):
    spec = save({"text": ["good", None, "", "fine"], "n": [1, 2, 3, 4]}, tmp_path / "ds")
    where = str((tmp_path / "ds").resolve())
    with pytest.raises(ValueError, match=rf"{where}: no field 'body' \(fields: 'text', 'n'\); choose it "
                                         rf"with --text-field \(skip_bad=True"):
        build(spec, tmp_path, text_field="body")
    with pytest.raises(ValueError, match=rf"{where} row 1: field 'n' is int, not a string"):
        build(spec, tmp_path, text_field="n")
    with pytest.raises(ValueError, match=rf"{where} row 2: field 'text' is null"):
        build(spec, tmp_path)
    corpus = build(spec, tmp_path, skip_bad=True)
    assert texts_of(corpus) == ["good", "fine"]
    assert corpus.skipped_by_kind == {"not a string": 1, "empty": 1}
    with pytest.raises(ValueError, match=r"no documents to train on \(all 4 inputs were malformed\)"):
        build(spec, tmp_path, text_field="n", skip_bad=True)


def test_bad_json_rows(tmp_path):
    data = tmp_path / "j"
    data.mkdir()
    (data / "a.jsonl").write_text('{"text": "x"}\n{"text": 5}\n{"text": "y"}\n')
    with pytest.raises(ValueError, match=r"a\.jsonl row 2: field 'text' is int, not a string"):
        build(f"hf-dataset:{data}", tmp_path)
    assert texts_of(build(f"hf-dataset:{data}", tmp_path, skip_bad=True)) == ["x", "y"]
    (data / "a.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(ValueError, match=r"a\.jsonl: no field 'text' \(fields: 'body'\)"):
        build(f"hf-dataset:{data}", tmp_path)
