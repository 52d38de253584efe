"""Dynamic tables end to end: `het serve --table NAME:dynamic:DIM` over TCP, and local jobs on
raw hashed ids (admission, a row budget, checkpoints) with several shards."""

import subprocess
import sys

import pytest
import torch

from het.ps.client.client import PSClient
from jobs import het, shared_file

pytestmark = pytest.mark.cluster

SMALL = ["--dim", "8", "--batch", "64", "--synthetic-cap", "2000", "--eval-samples", "4096", "--json", "--quiet"]


def test_het_serve_holds_a_dynamic_table_of_raw_int64_keys():
    proc = subprocess.Popen([sys.executable, "-m", "het", "serve", "--bind", "127.0.0.1:0", "--table", "user:dynamic:8",
                             "--admit-after", "2", "--max-rows", "1000"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on tcp://127.0.0.1:" in line
        client = PSClient.connect([line.rsplit(" ", 1)[1].strip()])
        table = client.tables["user"]
        assert (table.rows, table.dim, table.admit_after, table.max_rows) == (None, 8, 2, 1000)
        keys = torch.tensor([-(2 ** 63), -5, 2 ** 62, 2 ** 63 - 1])
        for _ in range(2):  # the second push admits them
            client.wait(client.push("user", keys, torch.ones(4, 8), torch.ones(4, dtype=torch.int64)))
        rows, clocks = client.wait(client.pull("user", keys))
        assert clocks.tolist() == [1, 1, 1, 1]
        stats = client.stats()[0]["tables"]["user"]
        assert stats["rows"] == 4 and stats["refused_updates"] == 4 and stats["admitted"] == 4
        client.stop_servers()
        assert proc.wait(30) == 0
    finally:
        proc.kill()


@pytest.mark.slow  # about 13 s
def test_a_job_on_hashed_ids_with_two_shards_reports_what_they_hold(tmp_path):
    s = het("train", "--ids", "hashed", "--steps", "60", "--servers", "2", "--table-admit-after", "2", "--table-max-rows", "3000",
            *SMALL, "--log-dir", str(tmp_path))
    ps = s["ps"]
    assert 0 < ps["rows"] <= 2 * 3000 and ps["admitted"] >= ps["rows"] and ps["refused_updates"] > 0
    assert ps["evicted"] == ps["admitted"] - ps["rows"] and ps["bytes"] > 0 and ps["peak_rss_bytes"] > 0
    assert 0.5 < s["auc"] < 1 and s["hit_rate"] > 0


@pytest.mark.slow
def test_a_hashed_job_checkpoints_reshards_and_resumes(tmp_path):
    """4 steps, a checkpoint, reshard 1 -> 2 shards, 4 more: the same rows as 8 steps straight."""
    args = ["--ids", "hashed", "--staleness", "0", "--optimizer", "sgd", "--lr", "0.5", *SMALL, "--eval-samples", "0"]
    het("train", *args, "--steps", "8", "--checkpoint", str(tmp_path / "straight"), "--checkpoint-every", "8",
        "--log-dir", str(tmp_path / "l1"))
    het("train", *args, "--steps", "4", "--checkpoint", str(tmp_path / "half"), "--checkpoint-every", "4",
        "--log-dir", str(tmp_path / "l2"))
    subprocess.run([sys.executable, "-m", "het", "reshard", str(tmp_path / "half"), str(tmp_path / "half2"),
                    "--shards", "2"], check=True, capture_output=True, timeout=120)
    het("train", *args, "--steps", "8", "--servers", "2", "--resume", str(tmp_path / "half2"), "--checkpoint",
        str(tmp_path / "resumed"), "--checkpoint-every", "8", "--log-dir", str(tmp_path / "l3"))
    straight = torch.load(tmp_path / "straight" / "ps" / "shard-0.pt", weights_only=True)["tables"]["embedding"]
    parts = [torch.load(tmp_path / "resumed" / "ps" / f"shard-{i}.pt", weights_only=True)["tables"]["embedding"]
             for i in range(2)]
    keys = torch.cat([p["keys"] for p in parts])
    order = torch.argsort(keys)
    assert torch.equal(keys[order], straight["keys"])  # saved sorted by key
    assert torch.allclose(torch.cat([p["weight"] for p in parts])[order], straight["weight"], atol=1e-5)
    assert torch.equal(torch.cat([p["clocks"] for p in parts])[order], straight["clocks"])


@pytest.mark.slow  # about 13 s
def test_a_users_csv_prepared_and_trained_on(tmp_path):
    """The shared Criteo rows as a CSV with a header: `het data prepare table`, then `het train
    --data table:OUT` on a dynamic table."""
    lines = open(shared_file("data", "criteo_kaggle_head1000.tsv")).read().splitlines()
    header = ",".join(["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))])
    (tmp_path / "clicks.csv").write_text("\n".join([header, *(line.replace("\t", ",") for line in lines)]) + "\n")
    prepared = het("data", "prepare", "table", str(tmp_path / "clicks.csv"), str(tmp_path / "out"), "--label", "label",
                   "--dense", ",".join(f"I{i}" for i in range(1, 14)), "--sparse", ",".join(f"C{i}" for i in range(1, 27)),
                   "--log-dense", "--json", "--quiet")
    assert prepared["rows"] == 1000 and prepared["skipped"] == 0
    s = het("train", "--data", f"table:{tmp_path / 'out'}", "--model", "dlrm", "--steps", "15", "--dim", "8",
            "--batch", "64", "--json", "--quiet", "--log-dir", str(tmp_path / "logs"))
    assert s["steps"] == 15 and 0 < s["auc"] < 1 and s["ps"]["rows"] > 0 and "planted_auc" not in s

