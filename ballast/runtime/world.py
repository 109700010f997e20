"""Joining a distributed job: under torchrun, or as N local gloo ranks of this machine.

Multi-device and multi-node jobs are launched with `torchrun` (docs/design.md) and call
`init_distributed()` (`ballast train` directly, `verify`, `profile` and `bench` through
`job.drive`). `run_local` starts a whole gloo world on this machine, bound to 127.0.0.1, and
gets every rank's return value back: what those commands run on without torchrun, and what the
tests run on. A rank's error comes back once,
as the original error of the first rank that failed (its peers' consequent errors are echoes).

Every process group gets a timeout, so a dead or diverging peer ends in an error instead of a
hang: the world's is the one it was joined with, and `world_timeout()` hands the same one to
the groups made later (`ProcessGroups`), which torch would otherwise give its own defaults
(30 minutes under gloo, 10 under NCCL). A gloo rank's malloc keeps the memory its steps free
(`host_memory`), so no step pays page faults that another step's frees caused.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import reduction
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .host_memory import keep_freed_memory

COLLECTIVE_TIMEOUT = timedelta(minutes=5)
START_METHOD = "forkserver"
"""How `run_local` starts ranks: forked from a server process that imported torch and ballast
once (`PRELOADED`) and ran nothing else, so no thread pool or process group of its own is
copied into them. Spawned ranks would each import them again: about 4 s of CPU per rank,
which a test suite of a hundred jobs pays hundreds of times."""
PRELOADED = ["ballast.runtime.world", "ballast.train.loop", "torch._dynamo", "matplotlib.pyplot"]
"""What the fork server imports before it forks ranks: the runtime and the training loop, and
two that they import late: torch._dynamo, which torch.optim imports when a rank makes its
first optimizer, and matplotlib, with which rank 0 draws a run's report (about 0.6 s of CPU
each, a rank, a job; neither starts a thread)."""


def preload(*modules: str) -> None:
    """Have the fork server import `modules` too before it forks ranks: for a process that runs
    many jobs of one model family (a test suite, a notebook), whose library every rank would
    otherwise import again (transformers: ~4 s of CPU a rank). The server starts at this
    process's first `run_local`: call it before then. A module that fails to import is skipped
    there and imported by the ranks that need it, as without it."""
    PRELOADED.extend(m for m in modules if m not in PRELOADED)


_LOOPBACK = "127.0.0.1"
_joined_timeout: timedelta | None = None
"""The timeout of this process's world, once `_init_process_group` has joined it."""


def under_torchrun() -> bool:
    """True in a process that torchrun started (it sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def world_timeout() -> timedelta | None:
    """The collective timeout this process joined the world with (`init_distributed` or
    `run_local`); None if it did not join through them."""
    return _joined_timeout


def init_distributed(backend: str | None = None, timeout: timedelta = COLLECTIVE_TIMEOUT) -> None:
    """Join the job torchrun describes in the environment (RANK, WORLD_SIZE, MASTER_ADDR, ...).

    NCCL when CUDA is available (each process on the GPU LOCAL_RANK names), gloo otherwise.
    Safe across torchrun's restarts: its c10d rendezvous hands every attempt the same store,
    and what the ranks of an attempt write there (gloo's and NCCL's peer addresses) outlives
    them, so a restarted rank can read a dead rank's address and fail to connect
    (pytorch/pytorch#167288; here about one restart in two). A store prefix per attempt gives
    each attempt its own keys.
    """
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(process_device(backend))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Under the agent's store (the default) every rank is a client; otherwise rank 0 hosts it.
    hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and rank == 0
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, hosts,
                          timeout, multi_tenant=hosts)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    _init_process_group(backend, dist.PrefixStore(f"ballast/attempt-{attempt}", store), rank, world, timeout)


def run_local(world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 300.0,
              collective_timeout: timedelta = timedelta(seconds=120)) -> list[Any]:
    """Run `fn(*args)` on `world_size` gloo ranks of this machine; every rank's return value.

    `fn` must be importable (a module-level function): the ranks are fresh processes (`START_METHOD`).
    An exception in a rank stops the others and is raised here once, as the first rank's
    original error (its peers' echoes, `is_echo`, do not count): a ValueError as
    `RankInputError` (a ValueError with the rank's message), anything else as `RankFailed`
    with the rank's traceback;
    if the ranks have not all finished after `timeout` seconds they are stopped and
    TimeoutError is raised.
    """
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if under_torchrun():
        # Each of torchrun's processes would run a whole job of its own on the CPU and pass.
        raise ValueError("this command runs its own local gloo ranks and does not join torchrun's job: "
                         "run it without torchrun")
    # The parent owns the rendezvous store on a port the OS picked: no race for a "free" port.
    store = dist.TCPStore(_LOOPBACK, 0, None, True, collective_timeout, wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="ballast-ranks-") as out:
        mp.get_context(START_METHOD).set_forkserver_preload(PRELOADED)
        # The arguments travel as one pickled payload, tensors by value: passed as they are,
        # torch shares each tensor through a file descriptor, and the fork server passes at
        # most 252 (a video bench's batches hold hundreds of clips: "too many fds").
        payload = pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
        context = mp.start_processes(
            _rank_main, args=(world_size, store.port, collective_timeout, fn, payload, out, _Launcher.now()),
            nprocs=world_size, join=False, start_method=START_METHOD)
        deadline = time.monotonic() + timeout
        while not _join(context, out, max(0.0, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                for process in context.processes:
                    process.join()
                raise TimeoutError(f"{world_size} local ranks running {fn.__name__} did not finish "
                                   f"within {timeout:.0f} s")
        return [torch.load(Path(out) / f"{rank}.pt", weights_only=False) for rank in range(world_size)]


class RankFailed(RuntimeError):
    """A rank of `run_local` raised a defect (not a user error); the message holds its rank and
    traceback."""


class RankInputError(ValueError):
    """A rank of `run_local` raised a user error (a ValueError: bad input, a plan that cannot
    exist); the message is the rank's message, prefixed with the rank."""


class PeerFailed(RuntimeError):
    """Raised on the ranks that learn from a broadcast that rank `rank` failed, so that they stop
    too; the launcher reports the peer's own error, not this echo of it."""

    def __init__(self, rank: int, message: str, user_error: bool):
        super().__init__(f"stopped: rank {rank} failed: {message}")
        self.rank, self.message, self.user_error = rank, message, user_error

    @classmethod
    def raise_for(cls, failure: tuple[int, str, bool] | None, here: BaseException | None) -> None:
        """Raise a job's failure on this rank: `here` (this rank's own error) if it has one, else
        the peer's as PeerFailed; nothing when `failure` (rank, message, user error) is None."""
        if failure is None:
            return
        if here is not None:
            raise here
        raise cls(*failure)

    @staticmethod
    def describe(rank: int, error: BaseException) -> tuple[int, str, bool]:
        """What the other ranks need of this rank's error: (rank, message, whether a user error)."""
        return rank, str(error), isinstance(error, ValueError)


def is_echo(error: BaseException) -> bool:
    """Whether `error` is a consequence of another rank's failure, not a cause: a `PeerFailed`
    (a peer reported its error in a broadcast), or a collective that broke because a peer left
    (gloo: "Connection closed by peer" / "Connection reset"; NCCL: a DistBackendError) or
    stopped answering (a timeout)."""
    if isinstance(error, (PeerFailed, dist.DistBackendError)):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        mark in text for mark in ("Connection closed by peer", "Connection reset by peer", "Timed out",
                                  "timed out", "Broken pipe"))


GRACE_SECONDS = 3.0
"""How long the other ranks may take to report their own errors once one rank has failed,
before they are terminated: the first failure to reach the parent is often an echo."""


def _join(context: mp.ProcessContext, out: str, timeout: float) -> bool:
    spawn_log = logging.getLogger("torch.multiprocessing.spawn")
    level = spawn_log.level
    # torch logs a warning per rank it terminates after one failed; the failure is what this raises.
    spawn_log.setLevel(logging.ERROR)
    try:
        return context.join(timeout=timeout, grace_period=GRACE_SECONDS)
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
        raise _first_cause([json.loads(p.read_text()) for p in Path(out).glob("*.err")], e) from e
    finally:
        spawn_log.setLevel(level)


def _first_cause(reports: list[dict], failure: Exception) -> Exception:
    """The error to report for a failed job, from the ranks' reports: the first original error;
    else the cause a PeerFailed echo carries (its rank may have been stopped before reporting);
    else, when only broken connections were reported, the rank that died without a Python
    exception (killed, segfault), whose death they echo."""
    originals = sorted((r for r in reports if not r["echo"]), key=lambda r: r["time"])
    causes = [r["cause"] for r in sorted(reports, key=lambda r: r["time"]) if r.get("cause")]
    if originals:
        first = originals[0]
    elif causes:
        first = causes[0]
    elif isinstance(failure, mp.ProcessExitedException) or not reports:
        return failure
    else:
        first = min(reports, key=lambda r: r["time"])
    if first["user_error"]:
        return RankInputError(f"rank {first['rank']}: {first['message']}")
    return RankFailed(f"rank {first['rank']} failed:\n{first.get('traceback') or first['message']}")


class _FileDescriptor:
    """One of the launcher's file descriptors, pickled as the rank's own copy of it (sent over
    the fork server's socket)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _detach, (reduction.DupFd(self.fd),)


def _detach(duplicate) -> int:
    return duplicate.detach()


@dataclass(frozen=True)
class _Launcher:
    """What a rank takes from the launcher as a spawned process would: its environment and its
    standard output and error as they are at the launch. A forked rank would otherwise have the
    fork server's, which are the launcher's of when the server started (a variable set since,
    a redirection or a test's capture begun or ended since)."""

    environ: dict[str, str]
    stdout: _FileDescriptor | int
    stderr: _FileDescriptor | int

    @classmethod
    def now(cls) -> _Launcher:
        return cls(dict(os.environ), _FileDescriptor(1), _FileDescriptor(2))

    def adopt(self) -> None:
        os.environ.clear()
        os.environ.update(self.environ)
        for stream, fd in ((sys.stdout, self.stdout), (sys.stderr, self.stderr)):
            stream.flush()
            os.dup2(fd, stream.fileno())
            os.close(fd)


def _rank_main(rank: int, world_size: int, port: int, collective_timeout: timedelta,
               fn: Callable[..., Any], payload: bytes, out: str, launcher: _Launcher) -> None:
    launcher.adopt()
    if any(name == "lo" for _, name in socket.if_nameindex()):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's own connections stay on loopback too
    # Ranks share this machine's cores; more threads each would only fight over them.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    store = dist.TCPStore(_LOOPBACK, port, None, False, collective_timeout)
    _init_process_group("gloo", store, rank, world_size, collective_timeout)
    try:
        result = fn(*pickle.loads(payload))
        torch.save(result, Path(out) / f"{rank}.pt")
    except BaseException as e:
        # Written whole, then renamed: the parent may read the reports while a peer still writes.
        report = Path(out) / f"{rank}.err.tmp"
        cause = dict(rank=e.rank, message=e.message, user_error=e.user_error) if isinstance(e, PeerFailed) else None
        report.write_text(json.dumps(dict(rank=rank, time=time.time(), echo=is_echo(e), cause=cause,
                                          user_error=isinstance(e, ValueError), message=str(e),
                                          traceback=traceback.format_exc())))
        os.replace(report, report.with_suffix(""))
        raise
    finally:
        # Models, optimizers and FSDP states sit in reference cycles that hold process groups;
        # left to interpreter shutdown, their gloo work objects are torn down after Python is
        # half gone, and a rank occasionally aborts ("terminate called without an active
        # exception"; see pytorch/pytorch#179291). Collect them while everything is alive.
        gc.collect()
        dist.destroy_process_group()


def process_device(backend: str) -> torch.device | None:
    """The one device a process of this backend works on: under NCCL the GPU LOCAL_RANK names;
    None under gloo (its ranks compute on the CPU)."""
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else None


def rank_device() -> torch.device:
    """Where this process computes as a rank: its GPU in a job joined under NCCL
    (`init_distributed` selected LOCAL_RANK's), else the CPU (gloo ranks, and a process that has
    joined no job)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _init_process_group(backend: str, store: dist.Store, rank: int, world_size: int,
                        timeout: timedelta) -> None:
    """Join the world. Under NCCL the world is bound to this process's GPU (`device_id`): its
    communicator is created now, not at the first collective, and every group made from it
    later (`ProcessGroups`) is split from it (ncclCommSplit) when it is made, so no step pays
    a communicator's creation (0.1 s to seconds) the first time it uses a group, and their
    buffers are taken at start-up, before the first step measures what is left."""
    global _joined_timeout
    if backend == "gloo":  # a rank that computes on the CPU: see host_memory.py
        keep_freed_memory()
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout,
                            device_id=process_device(backend))
    _joined_timeout = timeout
