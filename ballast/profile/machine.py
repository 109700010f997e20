"""What a measurement ran on, and how loaded the machine was while it ran.

Profiles are only as good as the machine was quiet: on a shared host another job's threads
take cores from the ranks, and every time measured then is slower by a factor the cost model
cannot know. So every profile and every check records the machine and the 1-minute load
average sampled through the run, next to the errors it reports.
"""
from __future__ import annotations

import os
import platform
import threading

import torch

from ..vocabulary.cluster import GPU_RESERVE


def machine_info(world_size: int, device: str = "cpu", backend: str = "gloo") -> dict:
    """Host, CPU, memory, library versions, how the ranks use the cores, and what they measured on.

    `device` (a torch device type) and `backend` are those the ranks actually used, not what
    the machine has: local ranks (`run_local`) are gloo on the CPU even on a GPU machine. The
    defaults are theirs; torchrun's ranks say what they ran on (`profile` asks them)."""
    cpus = os.cpu_count() or 1
    info = dict(host=platform.node(), platform=platform.platform(), processor=platform.processor(),
                cpus=cpus, memory_bytes=physical_memory(), python=platform.python_version(), torch=torch.__version__,
                device=device, backend=backend, world_size=world_size, threads_per_rank=max(1, cpus // world_size))
    if device == "cuda":
        info["device_name"] = torch.cuda.get_device_name()
    return info


def measured_device(machine: dict) -> str:
    """The device type a profile's ranks measured on. Profiles written before it was recorded
    name only a backend, nccl whenever the machine had a GPU: read as GPU-measured, so that
    `--check` refuses rather than compares them with the CPU."""
    return machine.get("device", "cuda" if machine["backend"] == "nccl" else "cpu")


def physical_memory() -> float:
    """Bytes of RAM of this machine."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def default_device_memory(world: int, on_gpus: bool) -> float:
    """The memory per rank a profile plans for when --device-memory-gb does not say: on GPUs
    the card's own less the GPU presets' reserve (`cluster.GPU_RESERVE`; this process's GPU,
    LOCAL_RANK's), else this machine's RAM shared by its `world` ranks."""
    if on_gpus:
        total = torch.cuda.get_device_properties(int(os.environ.get("LOCAL_RANK", 0))).total_memory
        return float(total - GPU_RESERVE)
    return physical_memory() / world


class LoadMonitor:
    """Samples the 1-minute load average every `interval` seconds while in the `with` block."""

    def __init__(self, interval: float = 5.0):
        self.interval = interval
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> LoadMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict:
        """min / median / max of the 1-minute load average; `cpus` to read it against."""
        ordered = sorted(self.samples)
        return dict(min=ordered[0], median=ordered[len(ordered) // 2], max=ordered[-1],
                    samples=len(ordered), cpus=os.cpu_count())
