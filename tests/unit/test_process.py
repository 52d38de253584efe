"""The processes het starts (het.process): a child asked through its environment dies with its
parent, and a lower priority is set from outside, with no Python between fork and exec."""

import os
import subprocess
import sys
import time

import pytest

from het import process

CHILD = "from het.process import follow_parent; follow_parent(); import time; print('up', flush=True); time.sleep(60)"


def gone(pid: int, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_asked_to_die_with_its_parent_does_when_the_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time; from het.process import parent_env\n"
        f"c = subprocess.Popen([sys.executable, '-c', {CHILD!r}], env=parent_env(), stdout=subprocess.PIPE)\n"
        "assert c.stdout.readline() == b'up\\n'\n"
        "print(c.pid, flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        parent.kill()  # SIGKILL: no cleanup of its own runs
        parent.wait()
        assert gone(child), "the child outlived its killed parent"
    finally:
        if not gone(child, 0):
            os.kill(child, 9)


def test_a_child_whose_parent_died_before_it_asked_ends_at_once():
    env = dict(os.environ, **{process.PARENT_ENV: "1"})  # not its parent: the parent it was started by is gone
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, timeout=30)
    assert proc.returncode == -15 and b"up" not in proc.stdout


def test_the_ask_is_taken_and_not_passed_on_to_grandchildren():
    env = {k: v for k, v in os.environ.items() if k != process.PARENT_ENV}
    code = "from het.process import follow_parent, PARENT_ENV; import os; follow_parent(); print(PARENT_ENV in os.environ)"
    for child_env in (env, process.parent_env(env)):  # not asked; asked by its parent, this process
        out = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True, timeout=30)
        assert (out.returncode, out.stdout) == (0, "False\n")


def test_lower_priority_is_set_from_outside():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        process.lower_priority(proc.pid, 19)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == 19
    finally:
        proc.kill()
        proc.wait()
    process.lower_priority(proc.pid, 19)  # ended: nothing to lower, no error
