"""A gloo rank's malloc keeps the memory a step frees (ballast/runtime/host_memory.py): the next
step's tensors reuse those pages instead of faulting in fresh, zeroed ones."""
import resource

import torch

from ballast.runtime import host_memory, run_local

BLOCK = 16 << 20
"""Bytes of one activation: above glibc's default mmap threshold (128 KiB), below the fixed one."""
BLOCKS = 8
"""Activations a step holds at its peak: 128 MiB, above twice glibc's largest moving threshold
(2 x 32 MiB), so the default trims the heap's top at the step's end."""
STEPS = 4


def faults_of_last_step() -> int:
    """Minor page faults of the last of STEPS steps, each filling BLOCKS fresh tensors and freeing them."""
    for _ in range(STEPS):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        activations = [torch.ones(BLOCK // 4) for _ in range(BLOCKS)]
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        assert all(float(a[-1]) == 1.0 for a in activations)
        del activations
    return faults


def test_a_rank_refills_freed_memory_without_page_faults():
    # glibc's default hands every step's memory back and faults it in again: 32,736 of the 32,768
    # pages on the last step (checked without keep_freed_memory). Kept, the third and later steps
    # fault on none (the first grows the heap, the second fills the gaps of memalign's slack);
    # 5% leaves room for the interpreter's own small allocations between the two counter reads.
    pages = BLOCKS * BLOCK // 4096
    (faults,) = run_local(1, faults_of_last_step)
    assert faults < 0.05 * pages, f"{faults} page faults refilling {pages} freed pages"


def test_another_c_library_is_left_alone(monkeypatch):
    monkeypatch.setattr(host_memory, "_glibc", lambda: None)
    assert host_memory.keep_freed_memory() is False
