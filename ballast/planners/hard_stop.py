"""A call that cannot overrun its deadline: run in a forked child, killed past it.

A solver's own time limit is not always checked: HiGHS's presolve of a sub-MIP ran for 10+
minutes past a 10 s limit on one of setting A's batches (HiGHS issues #1501, #2226), and after
RENS was switched off another presolve path did the same on another batch. A planner must never
hang, so flexsp's solves run here: the child inherits the call's arguments (fork: nothing is
pickled on the way in), sends its result back through a pipe, and is killed once the deadline
passes. Written here rather than with `concurrent.futures`, whose pools cannot kill a worker.
"""
from __future__ import annotations

import multiprocessing
from typing import Any, Callable

GRACE_S = 2.0
"""Seconds past the caller's limit before the child is killed: a solver that honours its limit
returns within it plus the time to hand its result back."""


def call_with_hard_stop(fn: Callable[..., Any], seconds: float, *args: Any) -> tuple[bool, Any]:
    """(True, fn(*args)) if it returned within `seconds` + GRACE_S, else (False, None), the child
    killed. fn runs in a forked child and its result must pickle; an exception in it is raised
    here."""
    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(fn, args, writer), daemon=True)
    child.start()
    writer.close()
    sent = None
    try:
        if not reader.poll(seconds + GRACE_S):
            return False, None
        try:
            sent = reader.recv()
        except EOFError:  # the child died without a word (killed from outside, out of memory)
            pass
    finally:
        reader.close()
        if child.is_alive():
            child.kill()
        child.join()
    if sent is None:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} died in its child process (exit code {child.exitcode})")
    ok, value = sent
    if not ok:
        raise value
    return True, value


def _child(fn: Callable[..., Any], args: tuple, writer) -> None:
    try:
        result = (True, fn(*args))
    except BaseException as e:  # handed to the parent, which raises it
        result = (False, e)
    writer.send(result)
    writer.close()
