"""Helpers for the processes het starts (shards, workers, namespaced hosts)."""

from __future__ import annotations

import ctypes
import os
import signal


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In a child, before exec: ask Linux to send ``sig`` when the parent dies (no orphans)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: the parent's own cleanup still runs
        pass


def rss_bytes() -> int:
    """This process's resident set size now, in bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_rss_bytes() -> int:
    """This process's peak resident set size, in bytes (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def release_freed_memory() -> None:
    """Hand memory the allocator keeps after ``free`` back to the OS (glibc's ``malloc_trim``):
    a request's scratch and an index's rebuild free large arrays, and glibc keeps those pages
    resident for the next ones, in every thread's arena. A no-op where there is no glibc."""
    global _TRIM
    if _TRIM is None:
        try:
            _TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except OSError:
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM = None
