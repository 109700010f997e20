"""Where a record comes from: the code, the libraries, the date, the machine and how busy it was.

Every command that writes a JSON record (simulate --json, profile, profile --check, bench,
train's summary) and every bench script that writes into bench/results puts `provenance()`
under the record's top-level key "provenance", taken when the work starts: a record read later
names the commit it ran at and the load it ran under, so numbers from different runs are never
mistaken for one another. Planning times and measured seconds move with the load; the load
average at the start is what lets a reader compare them.
"""
from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

CHECKOUT = Path(__file__).resolve().parents[2]
"""The folder above the `ballast` package: a git checkout when ballast runs from a clone."""

RECORDS = "bench/results"
"""Records being written are not the code that wrote them: a change there does not make the
checkout dirty."""

RENDERED = ("docs/results.md", "README.md")
"""What `bench/results_doc.py` renders from the records (the results doc and README's headline
table): a bench script ends by rendering them, so without this the next script a session runs
would find its checkout dirty though its code is its commit's."""


def provenance() -> dict:
    """The record's origin: commit (and whether the checkout differs from it), torch and ballast
    versions, UTC date, machine, and the 1-, 5- and 15-minute load averages now."""
    commit, dirty = git_state(CHECKOUT)
    return {"commit": commit, "dirty": dirty, "torch": torch.__version__, "ballast": ballast_version(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def git_state(folder: Path) -> tuple[str, bool | None]:
    """(HEAD's commit, whether tracked files other than the records and what is rendered from
    them (`RECORDS`, `RENDERED`) differ from it) of the
    checkout whose top folder is `folder`; ("unknown", None) without git or when `folder` is not
    a checkout's top (an installed copy under a virtualenv inside some clone is not that clone)."""
    try:
        if Path(_git(folder, "rev-parse", "--show-toplevel")).resolve() != folder.resolve():
            return "unknown", None
        head = _git(folder, "rev-parse", "HEAD")
        changed = _git(folder, "status", "--porcelain", "--untracked-files=no", "--", ".",
                       *(f":(exclude){path}" for path in (RECORDS, *RENDERED)))
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    return head, bool(changed)


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()


def ballast_version() -> str:
    """The installed distribution's version; "unknown" when ballast runs from a folder that was
    never installed."""
    try:
        return metadata.version("ballast")
    except metadata.PackageNotFoundError:
        return "unknown"


def machine() -> dict:
    """Platform, CPU model and cores, and the GPU's name when CUDA is there."""
    info = {"platform": platform.platform(), "cpu": cpu_model(), "cores": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
