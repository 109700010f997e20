"""The recorded benchmark JSON in bench/results/, as the results document reads it."""
from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def record(name: str) -> dict:
    """bench/results/NAME.json, parsed."""
    return json.loads((RESULTS / f"{name}.json").read_text())


def recorded(name: str) -> bool:
    return (RESULTS / f"{name}.json").exists()


def commit_note(data: dict) -> str:
    """'; commit X' for a record that names the commit it ran at (its `provenance`), else ''."""
    commit = (data.get("provenance") or {}).get("commit")
    return f"; commit {commit[:7]}" if commit else ""
