"""het's native core: C++ operators for the hot paths (core.cpp), built by ``make`` with the
system g++ (``python -m het.native.build``).

The PyTorch code they replace stays as the reference: it is what runs on CUDA tensors, without
a build, or with ``HET_NATIVE=0``, and the tests hold the two paths equal bit for bit. Without
a usable build (none, one compiled from another version of core.cpp, or one compiled for
another CPU) het warns once and runs the reference.

On Linux the build targets the CPU it runs on (``-march=native``: AVX2 or AVX-512 where there
is some) and writes down that CPU's instruction sets beside the module (:data:`CPU_FILE`).
A machine that lacks one of them does not load the module (it could die on an illegal
instruction): it runs the reference and says to rebuild. Machines of several kinds sharing one
build: ``HET_NATIVE_MARCH=x86-64-v3 python -m het.native.build`` (any -march; empty for none).

    >>> from het import native
    >>> native.ops is None or native.ops.SOURCE_HASH == native.source_hash()
    True
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import warnings

ENV = "HET_NATIVE"  # "0": the reference path everywhere
SOURCE = os.path.join(os.path.dirname(__file__), "core.cpp")
MODULE = "het.native._het_native"
CPU_FILE = os.path.join(os.path.dirname(__file__), "_het_native.cpu")  # what the build targeted
# the instruction-set extensions among /proc/cpuinfo's x86 flags (the rest say nothing of
# what code may run: a hypervisor's, a clock's); ARM's "Features" are all of that kind
_X86_ISA = re.compile(r"^(mmx|sse|ssse|avx|fma|f16c|bmi|adx|abm|lzcnt|popcnt|movbe|aes|pclmul|vpclmul|vaes|gfni"
                      r"|sha|rdrand|rdseed|xsave|cx8|cx16|amx|clflushopt|clwb|serialize)")


def source_hash() -> str:
    """The hash the build compiles in: a build from another core.cpp is not used."""
    with open(SOURCE, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset:
    """This CPU's instruction-set extensions as Linux lists them (x86's ``flags``, filtered;
    ARM's ``Features``); empty where there is no such file."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == "flags":
                    return frozenset(v for v in value.split() if _X86_ISA.match(v))
                if name.strip() == "Features":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def _missing_cpu_flags() -> list[str]:
    """The instruction sets the build targeted (:data:`CPU_FILE`) that this CPU lacks."""
    try:
        with open(CPU_FILE) as f:
            built = json.load(f)
    except (OSError, ValueError):
        return []
    return sorted(set(built.get("flags", ())) - cpu_flags())


def _load():
    """The built module, or None and why not."""
    if os.environ.get(ENV, "1") == "0":
        return None, None
    missing = _missing_cpu_flags()
    if missing:  # checked before the import: loading it here could already hit such an instruction
        return None, (f"it was built for a CPU with {', '.join(missing[:6])}, which this one lacks: rebuild "
                      f"it here, or for machines of several kinds with HET_NATIVE_MARCH=x86-64-v3 python -m het.native.build")
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
