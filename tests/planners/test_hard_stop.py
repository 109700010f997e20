"""hard_stop: a call that cannot overrun its deadline (flexsp's HiGHS solves run through it)."""
from __future__ import annotations

import time

import pytest

from ballast.planners import hard_stop
from ballast.planners.hard_stop import call_with_hard_stop


def sleeps(seconds: float) -> str:
    time.sleep(seconds)
    return "woke"


def fails() -> None:
    raise ValueError("from the child")


def test_a_call_within_its_deadline_returns_its_value():
    assert call_with_hard_stop(sleeps, 5.0, 0.0) == (True, "woke")


def test_a_call_past_its_deadline_is_killed(monkeypatch):
    monkeypatch.setattr(hard_stop, "GRACE_S", 0.2)
    begin = time.perf_counter()
    assert call_with_hard_stop(sleeps, 0.3, 60.0) == (False, None)
    # Killed at the deadline plus the grace, not after the minute the call asked for.
    assert time.perf_counter() - begin < 10.0


def test_an_exception_in_the_child_is_raised_in_the_caller():
    with pytest.raises(ValueError, match="from the child"):
        call_with_hard_stop(fails, 5.0)
