"""bench/results: every JSON record names where it comes from, and none keeps rows of another run."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
RECORDS = sorted(RESULTS.glob("*.json"))


def keys(value) -> set[str]:
    """Every key of every object nested in `value`."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys(v)}
    return set()


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_record_names_its_commit_and_torch(path):
    record = json.loads(path.read_text())
    origin = record.get("provenance")
    assert origin is not None, f"{path.name} has no provenance"
    assert re.fullmatch(r"[0-9a-f]{40}", origin["commit"]) and origin["torch"] and origin["date"]
    assert "machine" in origin and "load_average" in origin
    assert origin["dirty"] is not True, f"{path.name} was made from code its commit does not hold"
    assert not {k for k in keys(record) if "carried_over" in k}, f"{path.name} keeps rows of another run"


def test_there_are_records():
    assert len(RECORDS) > 40
