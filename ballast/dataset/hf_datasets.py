"""The `hf-dataset:PATH` source: a Hugging Face `datasets` dataset on local disk, one row one document.

PATH is one of
  - a folder written by `Dataset.save_to_disk` (it holds `state.json`) or
    `DatasetDict.save_to_disk` (`dataset_dict.json`), read with `datasets.load_from_disk`
    (memory-mapped Arrow, nothing copied); of a DatasetDict, the `train` split, or its only
    split when it has one;
  - a .parquet, .jsonl or .json file, or a folder of them (recursively, sorted), each read with
    `datasets.load_dataset("parquet" / "json", data_files=[file], streaming=True)`: streamed, so
    the files are not converted into a copy in the datasets cache, and one at a time, so an
    error names its file and row.

The text is the field `text_field` (`--text-field`). Nothing goes to the network: the paths are
local, the "parquet" and "json" loaders ship with `datasets`, and `datasets` runs in offline
mode while ballast reads (a name that is not a local path is an error before `datasets` sees it).

The token cache keys such a source by the content digest of every file the dataset is made of
(`TextSource.files`: all non-hidden files of a saved folder, or the data files), as for the
other file-based sources (cache.py): a copy elsewhere reuses the entry, any change misses it.

Malformed input is reported like the other sources' (sources.py): a `Bad` naming the path,
and the row (counting from 1) when one row is wrong: a missing field, a null, a non-string or
an empty value. The builder raises it, or skips and counts it under `skip_bad`.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .text_source import Bad, Doc, TextSource, files_under

HF_DATASET = "hf-dataset"
"""The kind (`TextSource.kind`) and spec prefix of this source."""
SAVED_MARKERS = ("state.json", "dataset_dict.json")
"""What `save_to_disk` writes at the top of its folder: a Dataset's state, or a DatasetDict's splits."""
DATA_FILES = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}
"""Data file suffix -> the `datasets` loader that reads it."""
BATCH = 1024
"""Rows read at once."""
EXPECTED = "a folder written by datasets' save_to_disk, or a .parquet, .jsonl or .json file or a folder of them"


def is_saved(path: Path) -> bool:
    return path.is_dir() and any((path / name).is_file() for name in SAVED_MARKERS)


def parse_hf_dataset(spec: str, arg: str, text_field: str) -> TextSource:
    """The source `hf-dataset:ARG`; ValueError naming the path when it is no dataset."""
    path = Path(arg).expanduser().resolve()
    if not path.exists():
        raise ValueError(f"data source {spec!r}: {path} does not exist (expected {EXPECTED})")
    if is_saved(path):
        files = files_under(path, "")
    elif path.is_dir():
        files = [f for f in files_under(path, "") if Path(f).suffix in DATA_FILES]
        if not files:
            raise ValueError(f"data source {spec!r}: {path} holds neither a dataset saved with "
                             f"save_to_disk ({' or '.join(SAVED_MARKERS)}) nor .parquet / .jsonl / "
                             f".json files")
    elif path.suffix in DATA_FILES:
        files = [str(path)]
    else:
        raise ValueError(f"data source {spec!r}: {path} is not {EXPECTED}")
    if not text_field:
        raise ValueError(f"data source {spec!r}: the text field name is empty")
    return TextSource(f"{HF_DATASET}:{path}", HF_DATASET, tuple(files), text_field, root=str(path))


def read_hf_dataset(src: TextSource) -> Iterator[Doc | Bad]:
    """Every row of the dataset `src` names, as a Doc or the Bad saying what is wrong with it."""
    assert src.root is not None and src.text_field is not None
    root = Path(src.root)
    with _offline():
        if is_saved(root):
            size = sum(os.path.getsize(f) for f in src.files)
            yield from _read_saved(root, src.text_field, size)
        else:
            for path in src.files:
                yield from _read_data_file(path, src.text_field)


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """`datasets` in offline mode (as HF_DATASETS_OFFLINE=1 would set it at import) for the block."""
    import datasets.config as config

    before = config.HF_HUB_OFFLINE
    config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        config.HF_HUB_OFFLINE = before


def _read_saved(root: Path, field: str, size: int) -> Iterator[Doc | Bad]:
    import datasets

    try:
        data = datasets.load_from_disk(str(root))
    except Exception as e:  # a damaged folder raises any of several types
        yield Bad(str(root), f"datasets.load_from_disk cannot read it ({type(e).__name__}: {e})",
                  "unreadable", size)
        return
    where = str(root)
    if isinstance(data, datasets.DatasetDict):
        splits = list(data)
        split = "train" if "train" in data else splits[0] if len(splits) == 1 else None
        if split is None:
            yield Bad(where, f"a DatasetDict without a 'train' split (splits: {', '.join(map(repr, splits))}); "
                             f"save the split to train on with save_to_disk and name its folder",
                      "no train split", size)
            return
        data, where = data[split], f"{where} split {split!r}"
    yield from _rows(data, where, field, size, data.num_rows)


def _read_data_file(path: str, field: str) -> Iterator[Doc | Bad]:
    import datasets

    size = os.path.getsize(path)
    # Streaming still takes lock files in its cache folder: a temporary one, gone afterwards.
    with tempfile.TemporaryDirectory(prefix="ballast-datasets-") as cache:
        try:
            data = datasets.load_dataset(DATA_FILES[Path(path).suffix], data_files=[path], split="train",
                                         streaming=True, cache_dir=cache)
        except Exception as e:
            yield Bad(path, f"datasets.load_dataset cannot read it ({type(e).__name__}: {e})",
                      "unreadable", size)
            return
        yield from _rows(data, path, field, size, None)


def _rows(data: Any, where: str, field: str, size: int, rows: int | None) -> Iterator[Doc | Bad]:
    """The rows of a Dataset or IterableDataset. `size` (bytes) is spread over `rows` for the
    progress bar; when the row count is unknown (streaming), a row counts its text's bytes."""
    names = data.column_names
    if names is not None:
        if field not in names:
            columns = ", ".join(map(repr, names[:8])) or "none"
            yield Bad(where, f"no field {field!r} (fields: {columns}); choose it with --text-field",
                      "missing field", size)
            return
        data = data.select_columns([field])
    if rows == 0:
        yield Bad(where, "no rows", "empty", size)
        return
    row = done = 0
    try:
        for batch in data.iter(batch_size=BATCH):
            values = batch.get(field)
            for i in range(len(next(iter(batch.values()), []))):
                row += 1
                value = values[i] if values is not None else _MISSING
                if rows:
                    nbytes = size * row // rows - done
                    done += nbytes
                else:
                    nbytes = len(value.encode("utf-8", "replace")) if isinstance(value, str) else 0
                yield _document(value, f"{where} row {row}", field, nbytes)
    except Exception as e:  # a file that fails part-way (a bad JSON line, a cut Parquet page)
        yield Bad(f"{where} after row {row}" if row else where,
                  f"cannot be read ({type(e).__name__}: {e})", "unreadable", 0)
        return
    if row == 0:
        yield Bad(where, "no rows", "empty", size)


_MISSING = object()


def _document(value: Any, where: str, field: str, nbytes: int) -> Doc | Bad:
    if value is _MISSING:
        return Bad(where, f"no field {field!r}; choose it with --text-field", "missing field", nbytes)
    if value is None:
        return Bad(where, f"field {field!r} is null", "not a string", nbytes)
    if not isinstance(value, str):
        return Bad(where, f"field {field!r} is {type(value).__name__}, not a string", "not a string", nbytes)
    if not value:
        return Bad(where, f"field {field!r} is empty", "empty", nbytes)
    return Doc(value, nbytes)
