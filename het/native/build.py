"""Build het's native core in place: ``python -m het.native.build`` (``make`` runs it).

torch.utils.cpp_extension compiles the .cpp files here with the system g++ against the
installed torch into one module, ``het/native/_het_native*.so``. A build prints one line; the
compiler's output is kept aside and printed only when the build fails (``-v``: all of it, as it
comes). A build that fails exits with status 0 unless ``--strict``: het then runs its PyTorch
reference path, with one warning.

On x86-64 and ARM Linux it compiles for this machine's CPU (``-march=native``) and writes the
instruction sets the module may use beside it (``<module file>.cpu``); a CPU without one of
them runs the reference path instead (:mod:`het.native`). ``HET_NATIVE_MARCH`` chooses another target (any
of g++'s ``-march`` values; empty: none), for a build shared by machines of several kinds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform as _platform
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MARCH_ENV = "HET_NATIVE_MARCH"


def march(environ=os.environ, platform: str = sys.platform, machine: str = _platform.machine()) -> str | None:
    """The ``-march`` of the build: ``HET_NATIVE_MARCH`` when set (empty: none), else
    ``native`` on x86-64 and ARM Linux, where the loader can tell another CPU (/proc/cpuinfo),
    and none elsewhere.

    Example:
        >>> march({}, "linux", "x86_64"), march({}, "linux", "ppc64le"), march({}, "darwin", "arm64")
        ('native', None, None)
        >>> march({MARCH_ENV: "x86-64-v2"}, "linux", "x86_64"), march({MARCH_ENV: ""}, "linux", "x86_64")
        ('x86-64-v2', None)
    """
    if MARCH_ENV in environ:
        return environ[MARCH_ENV].strip() or None
    return "native" if platform.startswith("linux") and machine in ("x86_64", "aarch64") else None


def compile_flags(target: str | None, source_hash: str) -> list[str]:
    """g++'s flags: -O3, floating point as written (no contraction into FMAs: the reference's
    bits), no errno from math, ``-march=target`` when there is one, and no debug information
    (Python's own flags ask for it: a quarter of the compile time, and most of the module).

    Example:
        >>> compile_flags("native", "ab12")[:3], compile_flags(None, "ab12")[:2]
        (['-O3', '-march=native', '-ffp-contract=off'], ['-O3', '-ffp-contract=off'])
    """
    return ["-O3", *([f"-march={target}"] if target else []), "-ffp-contract=off", "-fno-math-errno",
            "-std=c++20", "-g0", f'-DHET_SOURCE_HASH="{source_hash}"']


def unity_files(cpp: list[str], directory: str, cores: int) -> list[str]:
    """The sources as at most ``cores`` (and 4) files in ``directory`` that include several each,
    the largest dealt first: a file's own code compiles in a fraction of the time torch's
    headers take to parse (8-15 s a file here), so each group parses them once, and the groups
    compile side by side. A compiler's message names the source file and its line.

    Example:
        >>> d = tempfile.mkdtemp()
        >>> for name, size in (("a.cpp", 3), ("b.cpp", 2), ("c.cpp", 1)):
        ...     _ = open(os.path.join(d, name), "w").write("x" * size)
        >>> cpp = sorted(os.path.join(d, name) for name in os.listdir(d))
        >>> [[os.path.basename(line.split('"')[1]) for line in open(f)] for f in unity_files(cpp, d, 2)]
        [['a.cpp', 'c.cpp'], ['b.cpp']]
    """
    groups = [[] for _ in range(max(1, min(cores, 4, len(cpp))))]
    for i, path in enumerate(sorted(cpp, key=lambda p: (-os.path.getsize(p), p))):
        groups[i % len(groups)].append(path)
    out = []
    for i, group in enumerate(groups):
        out.append(os.path.join(directory, f"unity_{i}.cpp"))
        with open(out[-1], "w") as f:
            f.writelines(f'#include "{os.path.abspath(path)}"\n' for path in group)
    return out


def build(verbose: bool = False) -> str:
    """Compile the sources into one module; the path of the module built."""
    from setuptools import Extension  # noqa: F401  (setuptools first: it patches distutils)
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    from het.native import built_flags, source_hash, sources

    target = march()
    flags = compile_flags(target, source_hash())
    tmp = tempfile.mkdtemp(prefix="het-native-")
    try:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # macOS: no affinity
        compiled = unity_files([path for path in sources() if path.endswith(".cpp")], tmp, cores)
        ext = CppExtension("het.native._het_native", compiled, extra_compile_args=flags)
        # ninja, where installed, compiles the files in parallel; else one after another
        setup(name="het-native", ext_modules=[ext], cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
              script_args=["-q" if not verbose else "-v", "build_ext", "--build-temp", tmp, "--build-lib", tmp])
        built = [os.path.join(root, f) for root, _, files in os.walk(tmp) for f in files
                 if f.startswith("_het_native") and f.endswith(".so")]
        if len(built) != 1:
            raise RuntimeError(f"expected one _het_native*.so under {tmp}, found {built}")
        path = os.path.join(HERE, os.path.basename(built[0]))
        # the instruction sets it may use first: a module without its record loads anywhere
        with open(path + ".cpu.tmp", "w") as f:
            json.dump({"march": target, "flags": built_flags(target)}, f)
        os.replace(path + ".cpu.tmp", path + ".cpu")
        shutil.copyfile(built[0], path + ".tmp")
        os.replace(path + ".tmp", path)  # a running process keeps the old file's inode
        return path
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def current() -> bool:
    """Whether the module here loads (these sources' hash, a CPU it runs on) and was built for the
    target a build would use now (``HET_NATIVE_MARCH``)."""
    import torch  # noqa: F401  (the module links against torch's libraries, loaded first)

    from het import native

    record = native.record_path()
    ops, _ = native._load()  # again, torch loaded: ``python -m`` imported the package before it
    if ops is None or record is None or not os.path.exists(record):
        return False
    try:
        with open(record) as f:
            return json.load(f).get("march") == march()
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _output_to(path: str):
    """Within the block, everything written to this process's stdout and stderr, its child
    processes' too (the compiler's), goes to the file ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(path, "wb") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, old in zip((1, 2), saved):
            os.dup2(old, fd)
            os.close(old)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m het.native.build", description=__doc__.splitlines()[0])
    p.add_argument("--strict", action="store_true", help="exit with status 1 if the build fails")
    p.add_argument("-v", "--verbose", action="store_true", help="show the compiler's output as it comes")
    p.add_argument("--if-stale", action="store_true", help="build only when no module of these sources, for this "
                   "target, loads here (what make runs)")
    args = p.parse_args(argv)
    if args.if_stale and current():
        print("het: the native core is built from these sources for this target")
        return 0
    logs = tempfile.mkdtemp(prefix="het-native-log-")
    log = os.path.join(logs, "build.log")
    try:
        with contextlib.nullcontext() if args.verbose else _output_to(log):
            path = build(args.verbose)
    except (Exception, SystemExit) as e:  # setuptools reports a compiler failure as SystemExit
        if not args.verbose:
            with open(log, errors="replace") as f:
                sys.stderr.write(f.read())
        print(f"het: the native core did not build ({type(e).__name__}: {e}); het will run its PyTorch "
              f"reference path (slower on CPU). Needs g++ and the Python headers.", file=sys.stderr)
        return 1 if args.strict else 0
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    print(f"het: built the native core: {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
