"""Big row arrays on transparent huge pages.

A step reads and writes a few thousand random rows of arrays of hundreds of MB (a worker
cache's rows and pending gradients, a shard's table and optimizer state). On 4 KiB pages
nearly every row is a TLB miss as well as a cache miss. Linux backs an anonymous mapping with
2 MiB pages where the process asks for them (``madvise(MADV_HUGEPAGE)``; the usual setting of
``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise``, which honours only that), and
random row updates then run faster (docs/RESULTS.md, "Huge pages").

The advice is a hint: asked before the first touch, the pages come huge where the kernel has
them, and 4 KiB ones where it has not, or on another platform. The tensor is the same either
way. ``HET_HUGEPAGES=0`` turns the advice off (to compare).

    >>> t = zeros(3, 4)  # small: plain pages
    >>> t.shape, t.dtype, float(t.sum())
    (torch.Size([3, 4]), torch.float32, 0.0)
"""

from __future__ import annotations

import ctypes
import os
import sys

import torch

ENV = "HET_HUGEPAGES"
PAGE = 2 << 20           # a huge page on x86-64 and arm64 (4 KiB base pages)
MIN_BYTES = 8 << 20      # smaller arrays: a few TLB entries cover them anyway
_MADV_HUGEPAGE = 14      # <sys/mman.h>, Linux


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise()


def advise(t: torch.Tensor) -> bool:
    """Ask for huge pages under ``t``'s memory (the whole 2 MiB pages inside it); whether the
    kernel took the advice. Pages already touched stay as they are: ask before writing."""
    if _MADVISE is None or t.device.type != "cpu" or os.environ.get(ENV, "1") == "0":
        return False
    lo = t.data_ptr()
    hi = lo + t.numel() * t.element_size()
    start, end = -(-lo // PAGE) * PAGE, hi // PAGE * PAGE
    if end <= start:
        return False
    return _MADVISE(start, end - start, _MADV_HUGEPAGE) == 0


def empty(*shape, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """``torch.empty``, on huge pages where it is big (``MIN_BYTES``) and on the CPU."""
    t = torch.empty(*shape, dtype=dtype, device=device)
    if t.numel() * t.element_size() >= MIN_BYTES:
        advise(t)
    return t


def zeros(*shape, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """``torch.zeros``, on huge pages where it is big."""
    return empty(*shape, dtype=dtype, device=device).zero_()


def full(shape, value, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """``torch.full``, on huge pages where it is big."""
    return empty(*shape, dtype=dtype, device=device).fill_(value)
