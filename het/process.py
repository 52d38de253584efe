"""Helpers for the processes het starts (shards, workers, namespaced hosts).

A het process that starts ``python -m het ...`` while it runs threads (a worker's publisher, a
shard's IO, torch's pools) runs no Python between fork and exec (``preexec_fn``, which can
deadlock on a lock another thread held at the fork, leaving a copy of the parent that never
execs): the child is asked to die with its parent through its environment
(:func:`parent_env`, taken by :func:`follow_parent` as ``het`` starts), and a lower priority is
set from outside (:func:`lower_priority`).
"""

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


PARENT_ENV = "HET_DIE_WITH_PARENT"


def parent_env(env: dict | None = None) -> dict:
    """``env`` (default: this process's) for a ``python -m het`` child that is to get SIGTERM
    when this process dies: :func:`follow_parent` reads it in the child."""
    return dict(os.environ if env is None else env, **{PARENT_ENV: str(os.getpid())})


def follow_parent() -> None:
    """In a ``het`` process started with :func:`parent_env`: die with the parent, as
    :func:`die_with_parent` asks; a parent gone before the ask is a SIGTERM at once. The
    variable is taken, so this process's own children are asked of it, not of its parent."""
    parent = os.environ.pop(PARENT_ENV, None)
    if parent is None:
        return
    die_with_parent()
    if str(os.getppid()) != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def lower_priority(pid: int, nice: int) -> None:
    """Run process ``pid`` (a child just started) at niceness ``nice``: what training does not
    use. Set from outside, not in the child before exec (see the module)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except (ProcessLookupError, PermissionError):  # it ended already, or it is not ours to lower
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
