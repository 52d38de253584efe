"""Running `het` commands from tests (tests only)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx


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


class Server:
    """``het serve-model ARGS`` on a free loopback port, stopped (and its children) on exit."""

    def __init__(self, *args, env=None):
        self.proc = subprocess.Popen([sys.executable, "-m", "het", "serve-model", *args, "--bind", "127.0.0.1:0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     start_new_session=True)
        try:
            line = self.proc.stdout.readline()
            if "serving" not in line:
                raise AssertionError(f"het serve-model did not start: {line}{self.proc.stderr.read()[-2000:]}")
            self.url = line.strip().split(" on ")[1].split(" ")[0]
            self.client = httpx.Client(base_url=self.url, timeout=30)
        except BaseException:  # whatever stops the start, the server goes with it
            self.stop()
            raise

    def predict(self, body, **kw) -> httpx.Response:
        if isinstance(body, (dict, list)):
            return self.client.post("/v1/predict", json=body, **kw)
        return self.client.post("/v1/predict", content=body, **kw)

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/statm") as f:
            return int(f.read().split()[1]) * 4096

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def write_csv(path, rows: int, shift: float = 0.0, seed: int = 0) -> None:
    """A raw table of clicks: a 0/1 label ``clicked`` that follows ``price`` (a column centred on
    ``shift``), and two categorical columns, ``city`` and ``ad``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    price = rng.normal(shift, 1.0, rows)
    city = rng.choice(["paris", "oslo", "rome", "lima"], rows)
    ad = rng.integers(0, 50, rows)
    clicked = (rng.random(rows) < 1 / (1 + np.exp(-2 * (price - shift)))).astype(int)
    with open(path, "w") as f:
        f.write("clicked,price,city,ad\n")
        f.writelines(f"{c},{p:.4f},{t},ad{a}\n" for c, p, t, a in zip(clicked, price, city, ad))


# a small publishing job (het train --publish): one worker, a small table
PUBLISH_JOB = ("--workers", "1", "--synthetic-cap", "1000", "--dim", "16", "--batch", "128", "--eval-samples", "3000")


def held_out(model, n: int = 3000):
    """``n`` held-out samples of an export's synthetic data: (dense, the table's keys)."""
    import torch

    from het.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig

    gen = SyntheticCriteo(SyntheticCriteoConfig(**model.manifest["input"]["synthetic"]))
    b = gen.batch("test", 0, n)
    return b.dense, torch.from_numpy(model.inputs.table_keys(b.sparse.numpy()))
