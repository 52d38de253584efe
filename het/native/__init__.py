"""het's native core: C++ operators for the hot paths (core.cpp), built by ``make`` with the
system g++ (``python -m het.native.build``).

The PyTorch code they replace stays as the reference: it is what runs on CUDA tensors, without
a build, or with ``HET_NATIVE=0``, and the tests hold the two paths equal bit for bit. Without
a usable build (none, or one compiled from another version of core.cpp) het warns once and
runs the reference.

    >>> from het import native
    >>> native.ops is None or native.ops.SOURCE_HASH == native.source_hash()
    True
"""

from __future__ import annotations

import hashlib
import importlib
import os
import warnings

ENV = "HET_NATIVE"  # "0": the reference path everywhere
SOURCE = os.path.join(os.path.dirname(__file__), "core.cpp")
MODULE = "het.native._het_native"


def source_hash() -> str:
    """The hash the build compiles in: a build from another core.cpp is not used."""
    with open(SOURCE, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def _load():
    """The built module, or None and why not."""
    if os.environ.get(ENV, "1") == "0":
        return None, None
    try:
        ops = importlib.import_module(MODULE)
    except ImportError as e:
        return None, f"it is not built ({e})"
    if ops.SOURCE_HASH != source_hash():
        return None, "its build is from another version of het/native/core.cpp"
    return ops, None


ops, _why_not = _load()


def usable(*tensors) -> bool:
    """Whether the native operators take these tensors (built, and every tensor on the CPU).
    The first time they are wanted and not built, one warning says why."""
    global _why_not
    if ops is None:
        if _why_not is not None:
            warnings.warn(f"het's native core is not used: {_why_not}. Run `make` (or `python -m "
                          f"het.native.build`) to build it; until then het runs its PyTorch reference "
                          f"path, slower on CPU (set {ENV}=0 to choose that path and silence this warning).",
                          RuntimeWarning, stacklevel=2)
            _why_not = None
        return False
    return all(t.device.type == "cpu" for t in tensors)


def unique_inverse(keys):
    """``torch.unique(keys, return_inverse=True)``: the distinct keys, sorted, and each key's
    position among them; natively for int64 keys on the CPU (a radix sort where torch's is a
    comparison sort), the same tensors. Shape: (n,) -> (m,), (n,)."""
    import torch

    if keys.dtype == torch.int64 and keys.dim() == 1 and ops is not None and keys.device.type == "cpu":
        unique, inverse = ops.unique_inverse(keys.contiguous())
        return unique, inverse
    return torch.unique(keys, return_inverse=True)
