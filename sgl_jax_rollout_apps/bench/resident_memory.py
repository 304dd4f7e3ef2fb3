"""Resident memory of this process, for the benchmarks that bound its growth (`bench soak`).

Owns `settled_rss_bytes` (after a garbage collection and `malloc_trim`) and `rss_bytes` (as it
is); Linux only (`/proc/self/status`).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc


def settled_rss_bytes() -> int:
    """Resident memory of live objects: VmRSS after a garbage collection and glibc's
    `malloc_trim`, which hands freed heap pages back to the system.

    Untrimmed, VmRSS swings by up to ~100 MB (15% of the tiny model's process) with the last
    call's transient prefill and scoring buffers, freed but still cached by the allocator; a
    leak keeps its memory live, so trimming does not hide one.
    """
    gc.collect()
    with contextlib.suppress(AttributeError, OSError):  # not glibc: VmRSS as it is
        ctypes.CDLL(None).malloc_trim(0)
    return rss_bytes()


def rss_bytes() -> int:
    """Resident set size of this process (VmRSS of /proc/self/status; Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS line in /proc/self/status")
