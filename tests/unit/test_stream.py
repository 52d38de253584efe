"""A stream of partitions (het.data.stream) and its synthetic writer (het data stream-synthetic):
a partition is read only once complete, in order, once; what is refused says why; the planted
model drifts from partition to partition."""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest
import torch

from het.cli import main
from het.data.stream import MARKER, PartitionStream
from het.data.stream_synthetic import write_stream
from het.data.synthetic import SyntheticCriteo, SyntheticCriteoConfig
from jobs import write_csv

CFG = SyntheticCriteoConfig(cap=1000)


def test_partitions_are_read_in_order_across_their_boundaries(tmp_path):
    write_stream(str(tmp_path), 3, 0, 500, 0.05, CFG, say=lambda _: None)
    stream = PartitionStream(str(tmp_path / "part-*"))
    assert stream.refresh() == 3 and stream.rows == 1500 and not stream.skipped
    rows = stream.rows_between(490, 1010)  # three partitions' rows, in order
    data = SyntheticCriteo(CFG)
    want = [data.partition(p, 500, 0.05) for p in range(3)]
    assert torch.equal(rows.sparse[:10], want[0].sparse[490:])
    assert torch.equal(rows.sparse[10:510], want[1].sparse) and torch.equal(rows.sparse[510:], want[2].sparse[:10])
    assert [stream.partition_of(r) for r in (0, 499, 500, 1499)] == [0, 0, 1, 2]


def test_a_partition_written_slowly_is_not_read_until_its_marker_lands(tmp_path):
    """A writer that copies a partition's files one by one, then its marker: the stream waits
    for the marker, whatever files are there before it."""
    write_stream(str(tmp_path / "src"), 2, 0, 300, 0.0, CFG, say=lambda _: None)
    out = tmp_path / "stream"
    shutil.copytree(tmp_path / "src" / "part-00000", out / "part-00000")
    stream = PartitionStream(str(out / "part-*"), poll_s=0.02)
    assert stream.refresh() == 1
    seen = []

    def slow_writer():
        target = out / "part-00001"
        target.mkdir()
        for name in sorted(os.listdir(tmp_path / "src" / "part-00001")):
            if name != MARKER:
                shutil.copy(tmp_path / "src" / "part-00001" / name, target / name)
                time.sleep(0.1)
                seen.append(stream.refresh())  # every file but the marker there: nothing taken
        (target / MARKER).touch()

    writer = threading.Thread(target=slow_writer)
    writer.start()
    assert stream.wait_for(600, idle_s=30)
    writer.join()
    assert seen and not any(seen) and stream.rows == 600 and not stream.skipped


def test_out_of_order_damaged_and_duplicate_partitions_are_skipped_with_a_reason_and_never_taken(tmp_path):
    src = tmp_path / "src"
    write_stream(str(src), 3, 0, 200, 0.0, CFG, say=lambda _: None)
    out = tmp_path / "stream"
    out.mkdir()
    shutil.copytree(src / "part-00002", out / "part-00002")
    stream = PartitionStream(str(out / "part-*"))
    assert stream.refresh() == 1
    shutil.copytree(src / "part-00001", out / "part-00001")  # lands after a later one was taken
    shutil.copytree(src / "part-00002", out / "part-00003")  # the same files again, under a new name
    shutil.copytree(src / "part-00000", out / "part-00004")
    with open(out / "part-00004" / "train_labels.npy", "r+b") as f:  # one byte flipped
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert stream.refresh() == 0 and stream.rows == 200
    assert "out of order" in stream.skipped[str(out / "part-00001")]
    assert "duplicate of" in stream.skipped[str(out / "part-00003")]
    assert "damaged" in stream.skipped[str(out / "part-00004")]
    assert stream.refresh() == 0 and len(stream.skipped) == 3  # never tried again


def test_waiting_ends_after_idle_seconds_without_a_partition(tmp_path):
    stream = PartitionStream(str(tmp_path / "part-*"), poll_s=0.02)
    start = time.monotonic()
    assert not stream.wait_for(1, idle_s=0.2)
    assert 0.2 <= time.monotonic() - start < 5
    with pytest.raises(ValueError, match="not in the stream"):
        stream.rows_between(0, 1)


def test_stream_synthetic_writes_marked_partitions_whose_planted_model_drifts(tmp_path, capsys):
    main(["data", "stream-synthetic", str(tmp_path), "--partitions", "2", "--every", "0", "--rows", "4000",
          "--drift", "0.3", "--cap", "1000"])
    assert sorted(os.listdir(tmp_path)) == ["part-00000", "part-00001"]
    assert all(os.path.isfile(tmp_path / p / MARKER) for p in ("part-00000", "part-00001"))
    assert "part-00001" in capsys.readouterr().out
    data = SyntheticCriteo(CFG)
    late = data.partition(10, 20000, 0.3)  # 3 radians on: its labels follow another model
    from sklearn.metrics import roc_auc_score

    auc = {a: roc_auc_score(late.labels.numpy(), data.planted_logits(late.sparse, late.dense, a)) for a in (0.0, 3.0)}
    assert auc[3.0] > 0.75 and auc[0.0] < 0.5  # the first partitions' model is worse than chance there
    with pytest.raises(SystemExit, match="complete partition already"):
        main(["data", "stream-synthetic", str(tmp_path), "--partitions", "1", "--every", "0", "--rows", "10"])
    with pytest.raises(SystemExit, match="--rows must be >= 1"):
        main(["data", "stream-synthetic", str(tmp_path / "x"), "--rows", "0"])


def test_progressive_tallies_give_the_auc_and_log_loss_of_the_scores_they_hold():
    """Histograms of 4,096 bins, merged over partitions: AUC within 1e-4 of the exact one, log
    loss the mean of the rows'."""
    from sklearn.metrics import log_loss, roc_auc_score

    from het.train.streaming import Progressive

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(20000, generator=g)
    labels = (torch.rand(20000, generator=g) < torch.sigmoid(1.5 * logits)).float()
    parts = torch.arange(20000).numpy() // 5000  # four partitions
    tally = Progressive()
    tally.add(logits[:8000], labels[:8000], parts[:8000])
    tally.add(logits[8000:], labels[8000:], parts[8000:])
    m = Progressive.metrics(tally.merged(1), ["a", "b", "c", "d"])
    assert abs(m["auc"] - roc_auc_score(labels.numpy(), logits.numpy())) < 1e-4
    assert abs(m["logloss"] - log_loss(labels.numpy(), torch.sigmoid(logits).numpy())) < 1e-6
    assert [p["rows"] for p in m["by_partition"]] == [5000] * 4 and m["by_partition"][1]["partition"] == "b"
    # the rolling window: the latest whole chunks (7 of 8, the eighth filling)
    window = Progressive(window=4000)
    for lo in range(0, 20000, 1500):
        window.add(logits[lo:lo + 1500], labels[lo:lo + 1500], parts[lo:lo + 1500])
    w = window.window_metrics()
    assert w["rows"] == 3500
    assert abs(w["auc"] - roc_auc_score(labels[-3500:].numpy(), logits[-3500:].numpy())) < 1e-4
    assert Progressive.metrics(window.merged(1), list("abcd"))["window"]["rows"] == 3500


def test_raw_partitions_are_prepared_as_taken_under_the_first_ones_transforms(tmp_path):
    """CSV files land by a rename into place (a hidden name until then), a Parquet partition as
    a directory with its marker: each is prepared when taken, every row a training row, the
    columns inferred from the first and its dense transform kept for the others (a shifted
    column stays shifted); a file under a hidden or temporary name is never read."""
    import numpy as np
    import pyarrow.csv
    import pyarrow.parquet

    from het.data.prepared import PreparedDataset
    from het.data.stream_raw import RawPartitions

    out, prepared = tmp_path / "in", tmp_path / "prepared"
    out.mkdir()
    write_csv(tmp_path / "a.csv", 400, 0.0, 0)
    os.rename(tmp_path / "a.csv", out / "part-0.csv")
    write_csv(out / ".part-1.csv", 300, 5.0, 1)  # still being written: a hidden name
    write_csv(out / "part-2.csv.tmp", 300, 5.0, 2)
    stream = PartitionStream(str(out / "part-*"), raw=RawPartitions(str(prepared)))
    assert stream.refresh() == 1 and stream.rows == 400 and not stream.skipped
    os.rename(out / ".part-1.csv", out / "part-1.csv")
    (out / "part-3").mkdir()  # Spark's way: a directory of Parquet files, then _SUCCESS
    write_csv(tmp_path / "b.csv", 200, 5.0, 3)
    pyarrow.parquet.write_table(pyarrow.csv.read_csv(tmp_path / "b.csv"), out / "part-3" / "p-0.parquet")
    assert stream.refresh() == 1 and stream.rows == 700  # part-3 has no marker yet
    (out / "part-3" / MARKER).touch()
    assert stream.refresh() == 1 and stream.rows == 900 and not stream.skipped
    first, second = (stream.parts[i][1].rows_between("train", 0, 300) for i in (0, 1))
    assert first.dense.shape == (300, 1) and first.sparse.shape == (300, 2)  # price; city, ad
    assert abs(float(first.dense.mean())) < 0.2 and float(second.dense.mean()) > 3  # standardised by part-0's fit
    assert set(first.sparse[:, 0].tolist()) == set(second.sparse[:, 0].tolist())  # a city is one key everywhere
    again = PartitionStream(str(out / "part-*"), raw=RawPartitions(str(prepared)))  # a resumed job: kept
    made = sorted(os.listdir(prepared))
    again.adopt([p for p, _ in stream.parts])
    assert sorted(os.listdir(prepared)) == made and again.rows == 900
    assert np.array_equal(again.rows_between(0, 900).dense, stream.rows_between(0, 900).dense)
    (tmp_path / "schema.toml").write_text('label = "clicked"\ndense = ["price"]\nsparse = ["city"]\n')
    other = RawPartitions(str(prepared), str(tmp_path / "schema.toml"))  # other columns: prepared anew
    assert PreparedDataset(other.prepared(str(out / "part-0.csv"))).num_fields == 1
    write_csv(out / "part-1.csv", 300, 5.0, 9)  # rewritten in place: its preparation is not this file's
    assert other.prepared(str(out / "part-1.csv")) and not np.array_equal(
        PreparedDataset(other.prepared(str(out / "part-1.csv"))).rows_between("train", 0, 300).dense, second.dense)


def test_a_raw_stream_refuses_a_vocabulary_and_says_why_a_bad_partition_is_skipped(tmp_path):
    from het.data.stream_raw import RawPartitions

    out = tmp_path / "in"
    out.mkdir()
    write_csv(out / "part-0.csv", 100, 0.0, 0)
    (tmp_path / "schema.toml").write_text('label = "clicked"\ndense = ["price"]\nsparse = ["city"]\nmin_freq = 2\n')
    refused = PartitionStream(str(out / "part-*"), raw=RawPartitions(str(tmp_path / "p1"), str(tmp_path / "schema.toml")))
    assert refused.refresh() == 0 and "min_freq above 1" in refused.skipped[str(out / "part-0.csv")]
    stream = PartitionStream(str(out / "part-*"), raw=RawPartitions(str(tmp_path / "p2")))
    assert stream.refresh() == 1
    (out / "part-1.csv").write_text("something,else\n1,2\n")  # not the first one's columns
    assert stream.refresh() == 0 and "not found" in stream.skipped[str(out / "part-1.csv")]
