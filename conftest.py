"""Fixtures for the whole test run, the doctests in het/ included (tests/conftest.py holds the
rest)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_go_with_the_session():
    """Every temporary file or directory the tests make (a shard's temporary state directory,
    a job's scratch), in this process or the processes it starts, goes under one directory
    that is removed when the session ends, whether or not each test cleaned up after itself."""
    root = tempfile.mkdtemp(prefix="het-tests-")
    saved = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = os.environ["TMPDIR"] = root
    try:
        yield root
    finally:
        tempfile.tempdir = saved[0]
        if saved[1] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[1]
        shutil.rmtree(root, ignore_errors=True)
