"""Running `het` commands from tests (tests only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def het(*args, timeout=600, env=None) -> dict:
    """Run ``python -m het ARGS``; it must succeed; the JSON of its last line of output."""
    out = subprocess.run([sys.executable, "-m", "het", *args], capture_output=True, text=True, timeout=timeout,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting for its parent is dead for our purpose)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def shared_file(*parts) -> str:
    """A file of the project's shared folder (beside the checkout, or $HET_SHARED); the test is
    skipped where it is not there."""
    import pytest

    from het.data.graph import default_shared_dir

    path = default_shared_dir().joinpath(*parts)
    if not path.exists():
        pytest.skip(f"the shared data is not here: {path} (set HET_SHARED)")
    return str(path)
