"""Helpers for the processes het starts (shards, workers, namespaced hosts)."""

from __future__ import annotations

import ctypes
import signal


def die_with_parent() -> None:
    """In a child, before exec: ask Linux to send SIGTERM when the parent dies (no orphans)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: the parent's own cleanup still runs
        pass
