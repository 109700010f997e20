"""A CPU rank's allocator keeps the memory its steps free, as CUDA's caching allocator does on a GPU.

glibc's malloc hands large blocks back to the OS when they are freed (each block above a moving
mmap threshold is unmapped; the top of the heap is trimmed above twice that threshold), and
the next step that needs them takes them again one page fault at a time, each page zeroed by
the kernel. Which steps pay depends on what ran before them: in a benchmark that interleaves
nine planners, the one planner whose micro-batch needed the most memory (a degree-1 pack of
3,500 video tokens) took 40,000 page faults a step and ran 9-20% slower than the same
micro-batch alone, while the others took none (issue #31's notes). A cost model cannot price
that, and a GPU run never pays it: torch's CUDA allocator caches freed blocks for the process's
life. So a CPU rank asks glibc for the same: a fixed mmap threshold at glibc's ceiling (32 MiB;
fixing it stops the threshold from moving with each free) and no trimming. The price is that a
rank's resident memory stays at its peak, which is what a GPU rank's reserved memory does too.

Written here rather than by preloading jemalloc or tcmalloc (PyTorch's CPU tuning guide) because
those are not on every machine and must be set before the process starts; `mallopt` works on
the running process.
"""
from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""mallopt's parameter numbers (glibc's malloc.h)."""
MMAP_THRESHOLD = 32 << 20
"""glibc's largest mmap threshold on 64-bit hosts: blocks above it are still mapped per allocation."""
NO_TRIM = 2 ** 31 - 1
"""The largest trim threshold mallopt's int takes: the heap's top is never handed back."""


def keep_freed_memory() -> bool:
    """Make this process's malloc keep freed memory for reuse; False where the C library is not
    glibc (macOS, musl), whose allocator is left as it is."""
    libc = _glibc()
    if libc is None:
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, NO_TRIM) == 1
    assert ok, "glibc refused mallopt's documented parameters"
    return True


def _glibc() -> ctypes.CDLL | None:
    libc = ctypes.CDLL(None)  # the symbols already loaded into this process, its C library's among them
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None
