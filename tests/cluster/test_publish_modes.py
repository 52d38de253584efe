"""What a publishing job's versions hold (`het train --publish`): bounded deltas say how far
behind they may be and the last version is flushed; deltas store rows in the table's precision
or the one asked for, and a follower reads them back; the directory holds at most three bases'
bytes once its first base is written."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

from het import arrayfile
from het.export import load_model
from het.export.writer import export
from het.online.follow import Follower, newest_base
from het.online.live import Live
from het.train.published import base_name, bytes_under, delta_name, listing
from jobs import PUBLISH_JOB as JOB, het, held_out

pytestmark = pytest.mark.cluster


def _metas(pub) -> list[dict]:
    return [arrayfile.read(os.path.join(pub, delta_name(v)))[0] for v in listing(str(pub))[1]]


def test_bounded_deltas_say_how_far_behind_they_may_be_and_the_last_is_flushed(tmp_path):
    pub = tmp_path / "pub"
    s = het("train", *JOB, "--steps", "120", "--publish", str(pub), "--publish-every", "0.2", "--publish-keep", "1000",
            "--json")
    assert s["published"]["consistency"] == "bounded" and not s["published"]["failed"]
    metas = _metas(pub)
    assert len(metas) >= 2
    assert all(m["consistency"] == "bounded" and m["staleness"] == 100 and m["workers"] == 1 for m in metas[:-1])
    assert metas[-1]["consistency"] == "flush"


@pytest.mark.slow  # 10 s: the flush mode's versions, every one flushed
def test_flushed_publishing_flushes_every_version(tmp_path):
    flushed = het("train", *JOB, "--steps", "40", "--publish", str(tmp_path / "f"), "--publish-every", "0.2",
                  "--publish-consistency", "flush", "--publish-keep", "1000", "--json")
    assert flushed["published"]["consistency"] == "flush"
    assert {m["consistency"] for m in _metas(tmp_path / "f")} == {"flush"}


def test_a_bounded_version_holds_rank_0s_copies_of_the_rows_it_has_not_pushed(tmp_path):
    """A cache that holds every id and pushes nothing before s = 10,000 updates: the shards hold
    only initial rows until the end, so whatever a version's delta holds before the last flushed
    one is rank 0's view of the rows it updated, and a follower scores with it."""
    pub = tmp_path / "pub"
    s = het("train", *JOB, "--steps", "80", "--staleness", "10000", "--cache-frac", "1.0", "--publish", str(pub),
            "--publish-every", "0.2", "--publish-keep", "1000", "--checkpoint", str(tmp_path / "ck"),
            "--checkpoint-every", "80", "--json")
    metas = _metas(pub)
    assert s["published"]["deltas"] >= 2 and not s["published"]["failed"]
    assert all(m["view"] == "rank 0" and m["rows"] > 100 for m in metas[:-1]), metas
    meta, arrays = arrayfile.read(os.path.join(pub, delta_name(listing(str(pub))[1][0])))
    assert np.abs(arrays["rows.embedding"]).max() > 0.011  # moved past the initial rows' range (+-0.01)
    live = Live(newest_base(str(pub)))  # and the copies give way to the shards' rows: the end is exact
    Follower(live, str(pub)).poll()
    export(str(tmp_path / "ck"), str(tmp_path / "final"))
    final = load_model(str(tmp_path / "final"))
    dense, keys = held_out(final)
    assert np.array_equal(live.current.model(dense, keys).numpy(), final(dense, keys).numpy())


@pytest.mark.parametrize("flags, stored, exact", [(("--table-row-dtype", "bf16"), "bf16", True),
                                                  pytest.param(("--publish-dtype", "fp16"), "fp16", False,
                                                               marks=pytest.mark.slow)])
def test_deltas_store_rows_in_the_tables_precision_or_the_one_asked(tmp_path, flags, stored, exact):
    pub = tmp_path / "pub"
    s = het("train", *JOB, *flags, "--steps", "60", "--publish", str(pub), "--publish-every", "0.2",
            "--publish-keep", "1000", "--checkpoint", str(tmp_path / "ck"), "--checkpoint-every", "60", "--json")
    assert s["published"]["rows_dtype"] == stored
    meta, arrays = arrayfile.read(os.path.join(pub, delta_name(listing(str(pub))[1][-1])))
    assert meta["rows_dtype"] == stored and arrays["rows.embedding"].dtype == (np.uint16 if stored == "bf16" else np.float16)
    live = Live(newest_base(str(pub)))
    Follower(live, str(pub)).poll()
    assert live.current.number == s["published"]["version"]
    export(str(tmp_path / "ck"), str(tmp_path / "final"))
    final = load_model(str(tmp_path / "final"))
    dense, keys = held_out(final)
    gap = np.abs(live.current.model(dense, keys).numpy() - final(dense, keys).numpy()).max()
    assert gap <= 1e-6 if exact else 0 < gap < 1e-2


def base_bytes(pub) -> int:
    """The newest base's bytes, from its manifest (a base being removed reads as none)."""
    bases, _ = listing(str(pub))
    manifest = json.loads((pub / base_name(bases[-1]) / "export.json").read_text())["manifest"]
    return sum(f["bytes"] for f in manifest["files"].values()) + (pub / base_name(bases[-1]) / "export.json").stat().st_size


@pytest.mark.slow  # 16 s; the freshness benchmark reports the same bound
def test_the_directory_holds_at_most_three_bases_at_any_time(tmp_path):
    """Sampled every few milliseconds while a job publishes every 0.2 s: the newest base, the
    deltas since, the base being made and the delta being written stay within three bases; at
    the start, the snapshot of rows (no optimizer state) and the base exported from it within
    two and a bit (the dense model, written twice)."""
    pub = tmp_path / "pub"
    worst, start, stop = [0.0], [0], threading.Event()

    def watch():
        while not stop.wait(0.005):
            try:
                held = bytes_under(str(pub))
                if any(n.startswith(".snapshot-") for n in os.listdir(pub)):
                    start[0] = max(start[0], held)  # the first base, exported from a snapshot of the rows
                    continue
                worst[0] = max(worst[0], held / base_bytes(pub))
            except (OSError, IndexError, ValueError):
                continue  # not there yet, or a file removed while it was counted

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        s = het("train", *JOB, "--steps", "1500", "--publish", str(pub), "--publish-every", "0.2", "--json")
    finally:
        stop.set()
        watcher.join()
    assert s["published"]["bases_compacted"] >= 2 and not s["published"]["failed"]
    assert 1.0 < worst[0] <= 3.0, worst[0]
    assert 1.0 < start[0] / base_bytes(pub) <= 2.5, start[0] / base_bytes(pub)  # a fixed table: every base alike
