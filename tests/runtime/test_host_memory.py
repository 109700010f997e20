"""A gloo rank's malloc keeps the memory a step frees (ballast/runtime/host_memory.py): the next
step's tensors reuse those pages instead of faulting in fresh, zeroed ones."""
import ctypes
import json
import resource
import subprocess
import sys

import pytest

from ballast.runtime import host_memory, run_local

BLOCK = 64 << 10
"""Bytes of one activation: below glibc's mmap threshold, so every block comes from the heap and
what the test sees is the heap's top being trimmed or kept."""
BLOCKS = 2048
"""Activations a step holds at its peak: 128 MiB, far above glibc's trim threshold (twice its
moving mmap threshold, 256 KiB to 64 MiB)."""
PAGES = BLOCKS * BLOCK // 4096
STEPS = 6
SETTLE = 1
"""Steps that may fault: the first grows the heap to its peak."""


def faults_per_step() -> list[int]:
    """Minor page faults of each of STEPS steps that fill BLOCKS fresh blocks and free them.

    The blocks are taken from the C library's malloc itself, the allocator torch's CPU tensors
    come from: between the calls nothing else touches the heap, so the freed blocks are its top
    in every process. Made as torch tensors they were in only about half of the processes (the
    interpreter's own allocations landed above them in the others, and nothing was trimmed
    whatever the setting): a regression then showed one run in two."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.restype, libc.memset.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    blocks = [0] * BLOCKS  # made before the steps: a list growing among the blocks would sit above them
    faults = []
    for _ in range(STEPS):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for i in range(BLOCKS):
            blocks[i] = libc.malloc(BLOCK)
            libc.memset(blocks[i], 1, BLOCK)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        for i in range(BLOCKS):
            libc.free(blocks[i])
    return faults


def test_a_rank_refills_freed_memory_without_page_faults():
    # Kept, every step after the first faulted on 0 of its 32,768 pages (3 runs); 1% leaves room
    # for the interpreter's own allocations between the two counter reads.
    (faults,) = run_local(1, faults_per_step)
    assert max(faults[SETTLE:]) < 0.01 * PAGES, f"page faults per step {faults}, of {PAGES} pages refilled"


def test_the_probe_sees_glibcs_default_trim_the_heap():
    """The control: in a process that did not ask to keep its memory (not a rank), every step
    faults on nearly all of its pages again (32,744 of 32,768 in 6 of 6 runs), so the test above
    fails if a rank stops keeping what it frees."""
    if host_memory._glibc() is None:
        pytest.skip("not glibc: its trimming is what this probes")
    probe = f"import json, runpy; print(json.dumps(runpy.run_path({__file__!r})['faults_per_step']()))"
    faults = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                       check=True, timeout=120).stdout)
    assert min(faults[SETTLE:]) > 0.9 * PAGES, f"page faults per step {faults}, of {PAGES} pages refilled"


def test_another_c_library_is_left_alone(monkeypatch):
    monkeypatch.setattr(host_memory, "_glibc", lambda: None)
    assert host_memory.keep_freed_memory() is False
