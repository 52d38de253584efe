"""het's native core: C++ operators for the hot paths, one source file per component (the
cache's lookup and its fill and update, a fixed table's push and replies on the shard, initial
rows and lazy replies on the client, unique keys, the lookahead window), built into one
extension module by ``make`` with the system g++ (``python -m het.native.build``).

The PyTorch code they replace stays as the reference: it is what runs on CUDA tensors, without
a build, or with ``HET_NATIVE=0``, and the tests hold the two paths equal bit for bit. Without
a usable build (none, one compiled from other sources, or one compiled for another CPU) het
warns once and runs the reference.

On x86-64 and ARM Linux the build targets the CPU it runs on (``-march=native``: AVX2 or
AVX-512 where there is some) and writes down the instruction sets it may use beside the module
(``<module file>.cpu``). A machine that lacks one of them does not load the module (it could die
on an illegal instruction): it runs the reference and says to rebuild. Machines of several
kinds sharing one build: ``HET_NATIVE_MARCH=x86-64-v2 python -m het.native.build`` (or v3 for
AVX2; any -march, empty for none).

    >>> from het import native
    >>> native.ops is None or native.ops.SOURCE_HASH == native.source_hash()
    True
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
import warnings

ENV = "HET_NATIVE"  # "0": the reference path everywhere
HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = "het.native._het_native"
# the extensions among /proc/cpuinfo's x86 flags that a compiler emits on its own, from plain
# C++ (the rest: a hypervisor's, a clock's, or instructions only intrinsics reach, which a
# virtual machine may hide); ARM's "Features" are all instruction sets
_X86_ISA = re.compile(r"^(sse|ssse3|avx|fma|f16c|bmi|abm|popcnt|movbe|cx16|lahf_lm|3dnowprefetch|xop|tbm)")
_V2 = {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"}
# what g++'s -march=x86-64-vN assumes (the x86-64 psABI's levels), in /proc/cpuinfo's names
LEVELS = {"x86-64-v2": _V2, "x86-64-v3": _V3,
          "x86-64-v4": _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}}


def sources() -> list[str]:
    """The native core's source files (.cpp, compiled; .h, included), sorted by name."""
    return sorted(os.path.join(HERE, f) for f in os.listdir(HERE) if f.endswith((".cpp", ".h")))


def source_hash() -> str:
    """The hash the build compiles in, of every source file's name and bytes: a build from other
    sources is not used."""
    h = hashlib.sha256()
    for path in sources():
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()[:16]


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


def built_flags(target: str | None) -> list[str]:
    """The instruction sets a build for ``-march=target`` may use, as far as het can tell: this
    CPU's for ``native``, a level's for ``x86-64-vN``, none known otherwise."""
    if target == "native":
        return sorted(cpu_flags())
    return sorted(LEVELS.get(target, ()))


def record_path() -> str | None:
    """The file beside the module the import would load that names the instruction sets its
    build used (``<module file>.cpu``); None without a build."""
    try:
        spec = importlib.util.find_spec(MODULE)
    except (ImportError, ValueError):
        return None
    return spec.origin + ".cpu" if spec is not None and spec.origin else None


def missing_cpu_flags(record: str | None) -> list[str] | None:
    """The instruction sets the build of ``record`` used that this CPU lacks; None when the
    record is there but cannot be read (the build then is not trusted)."""
    if record is None or not os.path.exists(record):
        return []  # no build, or one from before builds targeted a CPU (plain x86-64)
    try:
        with open(record) as f:
            flags = json.load(f)["flags"]
        if not isinstance(flags, list) or not all(isinstance(v, str) for v in flags):
            raise TypeError(flags)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return sorted(set(flags) - cpu_flags())


def _load(record: str | None = None):
    """The built module, or None and why not (``record``: its CPU record, if not the usual)."""
    if os.environ.get(ENV, "1") == "0":
        return None, None
    missing = missing_cpu_flags(record or record_path())
    rebuild = "python -m het.native.build"
    if missing is None:
        return None, f"the record of the CPU it was built for cannot be read: rebuild it ({rebuild})"
    if missing:  # checked before the import: loading it here could already hit such an instruction
        return None, (f"it was built for a CPU with {', '.join(missing[:6])}, which this one lacks: rebuild it "
                      f"here ({rebuild}), or for machines of several kinds with HET_NATIVE_MARCH=x86-64-v2 {rebuild}")
    try:
        ops = importlib.import_module(MODULE)
    except ImportError as e:
        return None, f"it is not built ({e})"
    if ops.SOURCE_HASH != source_hash():
        return None, "its build is from other versions of het/native's sources"
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
