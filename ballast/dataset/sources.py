"""Text sources of the data pipeline: which files a spec names, and the documents in them.

  stdlib          the standard library's .py files (lengths.stdlib_files: the same
                  corpus `ballast simulate --lengths stdlib` draws lengths from); one file, one
                  document; empty files are not documents there, so not here either
  folder:PATH     every non-hidden file under PATH, recursively; one file, one document
  jsonl:PATH      a .jsonl file or a folder of them; one line, one JSON object, one document
                  (its `text_field`); blank lines are ignored
  parquet:PATH    a .parquet file or a folder of them; one row, one document (column
                  `text_field`, a string column)
  hf-dataset:PATH a Hugging Face `datasets` dataset on local disk (hf_datasets.py): a folder
                  written by `save_to_disk` (read with `load_from_disk`; of a DatasetDict, its
                  `train` split or its only one), or .parquet / .jsonl / .json files (a file or
                  a folder of them) read with `load_dataset("parquet" / "json")`; one row, one
                  document (field `text_field`); never the network

Files are read in sorted order of their path, so a corpus is the same on every machine that
holds the same files. Reading never raises on bad input: it yields a `Bad` naming the file
and line (lines and rows count from 1) and the builder raises or counts it, as the user asked.
A whole file is one `Bad` when nothing in it can be read (empty, binary, not Parquet, no such
column); one line or row is, when only that one is wrong.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

from .hf_datasets import HF_DATASET, parse_hf_dataset, read_hf_dataset
from .lengths import stdlib_files
from .text_source import Bad, Doc, TextSource, files_under

SYNTAX = "stdlib | folder:PATH | jsonl:PATH | parquet:PATH | hf-dataset:PATH | tokens:PATH"


def read_documents(src: TextSource) -> Iterator[Doc | Bad]:
    """Every document of the source, or the `Bad` saying what is wrong with one."""
    if src.kind == HF_DATASET:
        yield from read_hf_dataset(src)
        return
    reader = {"stdlib": _read_stdlib, "folder": _read_text_file,
              "jsonl": _read_jsonl, "parquet": _read_parquet}[src.kind]
    for path in src.files:
        yield from reader(path, src.text_field)


def parse_source(spec: str, text_field: str = "text") -> TextSource:
    """A text source spec; ValueError when it is malformed or names no files."""
    kind, colon, arg = spec.partition(":")
    if kind == "stdlib" and not colon:
        root, paths = stdlib_files()
        if not paths:
            raise ValueError(f"stdlib: no .py files under {root}")
        return TextSource("stdlib", "stdlib", tuple(sorted(paths)), None)
    if kind == HF_DATASET and arg:
        return parse_hf_dataset(spec, arg, text_field)
    suffix = {"folder": "", "jsonl": ".jsonl", "parquet": ".parquet"}.get(kind)
    if suffix is None or not arg:
        raise ValueError(f"unknown data source {spec!r}: expected {SYNTAX}")
    path = Path(arg).expanduser().resolve()
    if path.is_dir():
        files = files_under(path, suffix)
    elif path.is_file() and kind != "folder":
        files = [str(path)]
    else:
        what = "a folder" if kind == "folder" else f"a {suffix} file or a folder of them"
        raise ValueError(f"data source {spec!r}: {path} is not {what}")
    if not files:
        raise ValueError(f"data source {spec!r}: no {suffix or 'non-hidden'} files under {path}")
    field = text_field if kind in ("jsonl", "parquet") else None
    if field is not None and not field:
        raise ValueError(f"data source {spec!r}: the text field name is empty")
    return TextSource(f"{kind}:{path}", kind, tuple(files), field)


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _decode(data: bytes, where: str, locate: bool) -> str | Bad:
    """Strict UTF-8 text, or the Bad saying why not; `locate` adds the line of the bad byte
    (a whole file), which a caller that already names the line (one JSONL record) leaves out."""
    def at(offset: int) -> str:
        return f"{where} line {_line_of(data, offset)}" if locate else where

    if (nul := data.find(b"\0")) >= 0:
        return Bad(at(nul), "not a text file (NUL byte)", "not text", len(data))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        return Bad(at(e.start), f"not UTF-8 (byte 0x{data[e.start]:02x}: {e.reason})",
                   "not UTF-8", len(data))


def _read_text_file(path: str, _field: None) -> Iterator[Doc | Bad]:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        yield Bad(path, f"cannot read ({e.strerror or e})", "unreadable", 0)
        return
    if not data:
        yield Bad(path, "empty file", "empty", 0)
        return
    text = _decode(data, path, locate=True)
    yield text if isinstance(text, Bad) else Doc(text, len(data))


def _read_stdlib(path: str, _field: None) -> Iterator[Doc | Bad]:
    if os.path.getsize(path) > 0:  # bare __init__.py: not a sequence (as in lengths.stdlib_source)
        yield from _read_text_file(path, None)


def _read_jsonl(path: str, field: str) -> Iterator[Doc | Bad]:
    records = 0
    try:
        with open(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                records += 1
                yield _jsonl_record(raw, f"{path} line {number}", field)
    except OSError as e:
        yield Bad(path, f"cannot read ({e.strerror or e})", "unreadable", 0)
        return
    if not records:
        yield Bad(path, "empty file (no JSON lines)", "empty", 0)


def _jsonl_record(raw: bytes, where: str, field: str) -> Doc | Bad:
    n = len(raw)
    line = _decode(raw, where, locate=False)
    if isinstance(line, Bad):
        return line
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return Bad(where, f"invalid JSON ({e.msg} at column {e.colno})", "bad JSON", n)
    if not isinstance(record, dict):
        return Bad(where, f"expected a JSON object, got {type(record).__name__}", "not an object",
                   n)
    if field not in record:
        keys = ", ".join(map(repr, list(record)[:8])) or "none"
        return Bad(where, f"no {field!r} field (keys: {keys}); choose it with --text-field",
                   "missing field", n)
    text = record[field]
    if not isinstance(text, str):
        return Bad(where, f"field {field!r} is {type(text).__name__}, not a string",
                   "not a string", n)
    if not text:
        return Bad(where, f"field {field!r} is empty", "empty", n)
    return Doc(text, n)


def _read_parquet(path: str, field: str) -> Iterator[Doc | Bad]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    size = os.path.getsize(path)
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        yield Bad(path, f"not a readable Parquet file ({e})", "not Parquet", size)
        return
    schema = pf.schema_arrow
    if field not in schema.names:
        columns = ", ".join(map(repr, schema.names[:8]))
        yield Bad(path, f"no column {field!r} (columns: {columns}); choose it with --text-field",
                  "missing field", size)
        return
    kind = schema.field(field).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        yield Bad(path, f"column {field!r} has type {kind}, not string", "not a string", size)
        return
    rows = pf.metadata.num_rows
    if rows == 0:
        yield Bad(path, "empty file (no rows)", "empty", size)
        return
    row = done = 0  # rows have no byte size: progress spreads the file's size over them
    for batch in pf.iter_batches(columns=[field], batch_size=4096):
        for text in batch.column(0).to_pylist():
            row += 1
            nbytes = size * row // rows - done
            done += nbytes
            if text is None:
                yield Bad(f"{path} row {row}", f"column {field!r} is null", "not a string", nbytes)
            elif not text:
                yield Bad(f"{path} row {row}", f"column {field!r} is empty", "empty", nbytes)
            else:
                yield Doc(text, nbytes)
