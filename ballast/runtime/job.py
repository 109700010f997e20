"""A command's ranks: local gloo ranks it starts, or torchrun's processes it joins.

`ballast verify`, `profile` (and its `--check`) and `bench` do their work in one process and
run only their distributed part on ranks: `on_ranks(world, fn, *args)`, every rank's
`fn(*args)`. Outside torchrun those ranks are `world` local gloo ranks started for the call
(`world.run_local`). Launched by torchrun (`torchrun --nproc-per-node N -m ballast.cli verify
...`, as `train` is), a command runs under `drive`: every process joins torchrun's job as
`train`'s do (`init_distributed`: NCCL when CUDA is available, each process on the GPU
LOCAL_RANK names; gloo otherwise), rank 0 runs the command as the one process would (on its own
device), and the others serve it: each `on_ranks` call of rank 0's sends them `fn` and its
arguments, every rank runs it, and every rank's result comes back to rank 0 as `run_local`'s
would. When the command ends, rank 0 sends its exit status, or its error, and every rank ends
with it: a failed check is a non-zero exit on every rank, and an error of rank 0's (a flag, a
file, a plan that cannot exist) leaves no rank waiting.

Between calls the others wait for rank 0 (planning, a single-process reference, a corpus being
tokenised) in a broadcast over a gloo group of their own, bounded by CONTROL_TIMEOUT and not by
the collective timeout the job was joined with, which bounds the collectives of a step. A
rank 0 that dies instead of raising does not keep them waiting that long: torchrun's agent
stops every rank once one has failed. Nor is an error raised inside `fn` sent: every rank is
inside `fn` then, and it ends the job as an error in a training step does (the rank exits with
it, its peers' collectives break or torchrun's agent stops them).
"""
from __future__ import annotations

import gc
import os
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from .world import PeerFailed, init_distributed, rank_device, run_local, under_torchrun

CONTROL_TIMEOUT = timedelta(hours=24)
"""How long the serving ranks wait for rank 0's next message (see the module's docstring)."""
_control: dist.ProcessGroup | None = None
"""The gloo group rank 0's messages travel over, while `drive` runs; None otherwise."""
_inside_fn = False
"""Whether this rank raised inside an `on_ranks` function: then its peers are not waiting for a
message, and rank 0 sends none."""


def job_world(world: int | None, default: int | None) -> int | None:
    """The ranks a command runs on: torchrun's WORLD_SIZE under torchrun (a --world that differs
    is a ValueError naming both), else `world`, or `default` when it is None."""
    if not under_torchrun():
        return default if world is None else world
    size = int(os.environ["WORLD_SIZE"])
    if world is not None and world != size:
        raise ValueError(f"--world {world} does not match torchrun's WORLD_SIZE {size}")
    return size


def in_job(command: Callable[[], int], timeout: float) -> int:
    """`command()`'s exit status: under torchrun through `drive` (every process joined, rank 0
    running it, `timeout` seconds for each collective); else run here, starting its local ranks
    when it needs them."""
    return drive(command, timedelta(seconds=timeout)) if under_torchrun() else command()


def drive(command: Callable[[], int], timeout: timedelta) -> int:
    """Join torchrun's job; rank 0 runs `command`, the other ranks serve its `on_ranks` calls.
    Every rank returns rank 0's exit status, or raises: rank 0 its error, the others
    `PeerFailed` with it."""
    init_distributed(timeout=timeout)
    try:
        return driven(command)
    finally:
        gc.collect()  # before the groups go: see `world._rank_main`
        dist.destroy_process_group()


def driven(command: Callable[[], int]) -> int:
    """`drive`'s part on a job already joined: rank 0 runs `command` (`lead`), the others serve
    it (`serve`), their messages over a gloo group of their own made for it."""
    global _control, _inside_fn
    _control, _inside_fn = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT), False
    try:
        return lead(command) if dist.get_rank() == 0 else serve()
    finally:
        _control = None


def lead(command: Callable[[], int]) -> int:
    """Rank 0's part: run `command`, then send the others its exit status, or its error (unless
    it came from inside an `on_ranks` call)."""
    try:
        status = command()
    except Exception as e:
        if not _inside_fn:
            _send(("error", PeerFailed.describe(0, e)))
        raise
    _send(("exit", status))
    return status


def serve() -> int:
    """The other ranks' part: run what rank 0 sends until it sends its exit status (returned) or
    its error (raised as `PeerFailed`)."""
    while True:
        kind, content = _receive()
        if kind == "exit":
            return content
        if kind == "error":
            PeerFailed.raise_for(content, None)
        fn, args = content
        _gather(_run(fn, args))


def on_ranks(world: int, fn: Callable[..., Any], *args: Any, timeout: float = 300.0,
             collective_timeout: timedelta = timedelta(seconds=120)) -> list[Any]:
    """Every rank's `fn(*args)`, in rank order: on `world` local gloo ranks started now
    (`run_local`, with its `timeout` and `collective_timeout`), or, on rank 0 of a job that
    `drive` joined, on the job's ranks (the job's own collective timeout bounds them). `fn` must be
    importable (a module-level function) and return values that pickle on the CPU."""
    if _control is None:
        return run_local(world, fn, *args, timeout=timeout, collective_timeout=collective_timeout)
    assert dist.get_rank() == 0, "only rank 0 runs the command; the other ranks serve it"
    assert world == dist.get_world_size(), f"a call for {world} ranks in a job of {dist.get_world_size()}"
    _send(("run", (fn, args)))
    return _gather(_run(fn, args))


def job_backend() -> str:
    """The backend of the ranks `on_ranks` runs on: the joined job's under `drive`, else gloo's
    (local ranks)."""
    return dist.get_backend() if _control is not None else "gloo"


def describe_ranks(world: int) -> str:
    """The ranks a command runs on, for its log: "2 local gloo ranks", or under `drive` e.g. "8
    torchrun ranks (nccl, NVIDIA H100 80GB HBM3)" or "2 torchrun ranks (gloo, cpu)"."""
    if _control is None:
        return f"{world} local gloo ranks"
    device = rank_device()
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return f"{world} torchrun ranks ({job_backend()}, {where})"


def _run(fn: Callable[..., Any], args: tuple) -> Any:
    global _inside_fn
    try:
        return fn(*args)
    except BaseException:
        _inside_fn = True
        raise


def _send(message: tuple) -> None:
    dist.broadcast_object_list([message], src=0, group=_control)


def _receive() -> tuple:
    message = [None]
    dist.broadcast_object_list(message, src=0, group=_control)
    return message[0]


def _gather(result: Any) -> list[Any] | None:
    """Every rank's result on rank 0 (None on the others), over the control group: pickled on
    the CPU, whatever the job's backend."""
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(result, out, dst=0, group=_control)
    return out
