"""A server following a training job (`het train --publish`, `het serve-model --follow`): it ends
with the scores of the job's last checkpoint, never applies a delta cut off or damaged, and comes
back at the latest version after a kill -9."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from het.export import load_model
from het.export.writer import export
from het.online.follow import Follower, newest_base, scan
from het.online.live import Live
from het.train.publish import delta_name
from jobs import PUBLISH_JOB, het, held_out

pytestmark = pytest.mark.cluster

JOB = PUBLISH_JOB


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A job of 80 steps publishing every 0.2 s (a base every 3 deltas), checkpointed at its end."""
    tmp = tmp_path_factory.mktemp("pub")
    s = het("train", *JOB, "--steps", "80", "--publish", str(tmp / "pub"), "--publish-every", "0.2",
            "--publish-base-every", "3", "--checkpoint", str(tmp / "ck"), "--checkpoint-every", "80", "--json")
    return tmp, s


def test_a_follower_ends_with_the_scores_of_the_jobs_last_checkpoint(published):
    tmp, s = published
    pub = s["published"]
    assert pub["deltas"] >= 2 and pub["bases"] >= 1 and not pub["failed"]
    live = Live(newest_base(str(tmp / "pub")))
    follower = Follower(live, str(tmp / "pub"))
    follower.poll()
    assert live.current.number == pub["version"]
    export(str(tmp / "ck"), str(tmp / "final"))
    final = load_model(str(tmp / "final"))
    dense, keys = held_out(final)
    assert np.abs(live.current.model(dense, keys).numpy() - final(dense, keys).numpy()).max() <= 1e-6


@pytest.mark.slow  # about 15 s; one table's publishing runs in make test
def test_a_job_of_a_table_a_width_publishes_them_all_and_its_follower_ends_at_its_last_checkpoint(tmp_path):
    """--dim auto: a delta holds each width's table, a base is compacted from them, and the follower
    scores as the export of the job's last checkpoint."""
    s = het("train", *JOB, "--dim", "auto", "--steps", "60", "--publish", str(tmp_path / "pub"),
            "--publish-every", "0.2", "--publish-base-every", "2", "--checkpoint", str(tmp_path / "ck"),
            "--checkpoint-every", "60", "--json")
    pub = s["published"]
    assert len(s["widths"]) > 1 and pub["deltas"] >= 2 and pub["bases_compacted"] >= 1 and not pub["failed"]
    bases, deltas = scan(str(tmp_path / "pub"))
    live = Live(newest_base(str(tmp_path / "pub")))
    assert set(live.current.model.tables) == set(s["widths"])
    Follower(live, str(tmp_path / "pub")).poll()
    assert live.current.number == pub["version"]
    export(str(tmp_path / "ck"), str(tmp_path / "final"))
    final = load_model(str(tmp_path / "final"))
    dense, keys = held_out(final)
    assert np.abs(live.current.model(dense, keys).numpy() - final(dense, keys).numpy()).max() <= 1e-6


def test_a_delta_cut_off_or_damaged_is_never_applied(published, tmp_path, capsys):
    tmp, s = published
    pub = str(tmp_path / "pub")
    shutil.copytree(tmp / "pub", pub)
    bases, deltas = scan(pub)
    base = bases[-1]
    after = [d for d in deltas if d > base]
    for d in after:  # the follower starts at the base: later deltas go aside
        os.rename(os.path.join(pub, delta_name(d)), os.path.join(tmp_path, delta_name(d)))
    live = Live(newest_base(pub))
    follower = Follower(live, pub)
    assert live.current.number == base
    whole = (tmp_path / delta_name(after[0])).read_bytes()
    (tmp_path / "pub" / delta_name(after[0])).write_bytes(whole[:len(whole) // 2])  # cut off mid-write
    assert follower.poll() == 0 and live.current.number == base
    assert "skipped delta" in capsys.readouterr().err
    damaged = bytearray(whole)
    damaged[len(damaged) // 3] ^= 1
    (tmp_path / "pub" / delta_name(after[0])).write_bytes(bytes(damaged))
    assert follower.poll() == 0 and live.current.number == base  # waits for a newer base
    (tmp_path / "pub" / delta_name(after[0])).write_bytes(whole)
    follower.broken_after = None  # (a newer base would clear it: here the delta came whole again)
    assert follower.poll() == 1 and live.current.number == after[0]


@pytest.mark.slow  # a job and a follower killed and started again, 21 s; following: the tests above
def test_a_follower_killed_comes_back_at_the_latest_version(tmp_path):
    pub = tmp_path / "pub"
    job = subprocess.Popen([sys.executable, "-m", "het", "train", *JOB, "--steps", "1000000", "--time-limit", "40",
                            "--publish", str(pub), "--publish-every", "1", "--publish-base-every", "5", "--quiet",
                            "--eval-samples", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    server = None
    try:
        deadline = time.time() + 60
        while not scan(str(pub))[0] and time.time() < deadline:
            time.sleep(0.5)
        server = _serve(pub)
        url, proc = server
        time.sleep(4)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        restarted = time.monotonic()
        server = _serve(pub)
        url, proc = server
        while True:
            version = httpx.get(f"{url}/healthz").json()["version"]
            bases, deltas = scan(str(pub))
            latest = max(bases + deltas)
            if version >= latest - 1:  # the newest, or the one just published while it looked
                break
            assert time.monotonic() - restarted < 30, (version, latest)
            time.sleep(0.5)
    finally:
        for pid, sig in ((server[1].pid if server else None, signal.SIGKILL), (job.pid, signal.SIGTERM)):
            try:
                if pid is not None:
                    os.killpg(pid, sig)
            except ProcessLookupError:  # ended already (the job's time limit): what failed shows above
                pass
        job.wait(60)


def _serve(pub) -> tuple[str, subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-m", "het", "serve-model", "--follow", str(pub), "--poll-s", "0.2",
                             "--bind", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    line = proc.stdout.readline()
    assert "serving" in line, line
    return line.strip().split(" on ")[1].split(" ")[0], proc


@pytest.mark.slow  # about 17 s: a job long enough for several bases
def test_a_base_comes_once_the_deltas_since_the_last_hold_its_bytes(tmp_path):
    """Deltas that carry most of a small table: bases follow their bytes (each once the deltas
    written since the newest base written hold its bytes), not the count (--publish-base-every
    far off)."""
    from het.train.publish import listing

    pub = tmp_path / "pub"
    s = het("train", *JOB, "--steps", "1500", "--publish", str(pub), "--publish-every", "0.3",
            "--publish-base-every", "1000", "--publish-keep", "1000", "--json")
    published = s["published"]
    assert published["bases_for_size"] >= 1 and published["bases"] == 1 + published["bases_for_size"]
    bases, deltas = listing(str(pub))
    assert len(bases) == published["bases"] and len(deltas) < 1000
