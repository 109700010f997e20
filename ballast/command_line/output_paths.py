"""The commands' output paths, checked before the work they report on.

A result that cannot be written is found when the command starts, as one error naming the flag
and the path, not as a traceback after a whole simulation, profile or training run. A file's
folder must exist (as the writers need); a run folder is created. Either is writable when a file
can be made in it: tried with a temporary file, so a read-only file system or a file where a
folder should be is found as the user running the command meets it, root included.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def check_output_file(path: str | Path | None, flag: str) -> None:
    """ValueError naming `flag` unless a file can be written at `path` (None: not asked for)."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{flag} {path}: is a folder; give a file name")
    if not target.parent.is_dir():
        what = "is not a folder" if target.parent.exists() else "does not exist"
        raise ValueError(f"{flag} {path}: {target.parent} {what}")
    _check_folder(target.parent, path, flag)
    if target.exists() and not os.access(target, os.W_OK):
        raise ValueError(f"{flag} {path}: the file exists and is not writable")


def check_output_folder(path: str | Path, flag: str) -> None:
    """ValueError naming `flag` unless files can be written in the folder `path` (created if
    missing)."""
    if Path(path).exists() and not Path(path).is_dir():
        raise ValueError(f"{flag} {path}: is a file, not a folder")
    _check_folder(Path(path), path, flag)


def _check_folder(folder: Path, path: str | Path, flag: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:  # the OS's reason; the probe's own file name would only confuse
        raise ValueError(f"{flag} {path}: cannot write in {folder} ({e.strerror or e})") from None
