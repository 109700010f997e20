"""`ballast verify` from the command line: a passing run reports every planner, and exceeding a
tolerance is a non-zero exit (each run spawns 2 gloo ranks for one small step)."""
from __future__ import annotations

import re

import pytest

from ballast.cli import main

PLANNERS = ["static", "ballast"]
# One step of 6 sequences up to 64 tokens: enough for both planners to lay out a batch that
# the budget `verify` derives makes them checkpoint, small enough to run in seconds.
ARGS = ["verify", "--world", "2", "--planners", ",".join(PLANNERS), "--model", "tiny", "--steps", "1",
        "--batch", "6", "--max-len", "64"]


def verdicts(out: str) -> list[tuple[str, str]]:
    """(planner, ok / FAIL) of every row of verify's table."""
    return re.findall(rf"^\W*({'|'.join(PLANNERS)})\W.*\b(ok|FAIL)\W*$", out, re.MULTILINE)


@pytest.mark.slow
def test_verify_passes_and_reports_a_row_per_planner(capsys):
    assert main(ARGS) == 0
    assert verdicts(capsys.readouterr().out) == [(name, "ok") for name in PLANNERS]


@pytest.mark.slow
def test_verify_fails_when_a_tolerance_is_exceeded(capsys):
    # Two ranks sum the gradient in another order than one process, and AdamW turns the rounding
    # of small gradient entries into visible update differences: one step leaves a drift of
    # ~1e-5 of the distance moved (measured 1.1e-5), far above 1e-9, far below the default 1e-3.
    assert main([*ARGS, "--param-tolerance", "1e-9"]) == 1
    out = capsys.readouterr().out
    assert verdicts(out) == [(name, "FAIL") for name in PLANNERS]
    assert "2 planner(s) exceed the tolerance: static, ballast" in out


def test_negative_tolerances_are_refused_before_any_rank_starts(capsys):
    assert main([*ARGS, "--grad-tolerance", "-1"]) == 2
    assert "--grad-tolerance and --param-tolerance must be >= 0, got -1" in capsys.readouterr().err
