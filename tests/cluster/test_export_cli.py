"""`het export`, `het predict` and `het train --export` as users run them: exports of a running
job, one-line refusals with exit 2, and a table bigger than the memory a process may use."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import numpy as np
import pytest

from jobs import het

pytestmark = pytest.mark.cluster


def run(*args, limit_bytes=None, timeout=300) -> subprocess.CompletedProcess:
    """``python -m het ARGS``; with ``limit_bytes``, under that limit of the process's data
    (RLIMIT_DATA: its heap and private memory; a read-only map of a file is not counted). scipy's
    OpenBLAS (sklearn's AUC imports it) spins when its per-thread buffers are refused, so a
    limited process runs it with one thread."""
    def limit():
        resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, limit_bytes))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1") if limit_bytes else None
    return subprocess.run([sys.executable, "-m", "het", *args], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit if limit_bytes else None, env=env)


def one_line_refusal(out: subprocess.CompletedProcess, command: str, says: str) -> None:
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith(f"het {command}: error: ") and says in lines[0], lines[0]


@pytest.mark.slow  # about 27 s
def test_a_training_job_keeps_an_export_of_itself(tmp_path):
    out = str(tmp_path / "model")
    s = het("train", "--steps", "30", "--workers", "1", "--synthetic-cap", "1000", "--dim", "16",
            "--eval-samples", "4000", "--export", out, "--export-every", "12", "--json")
    assert s["exports"] == {"dir": out, "written": 3, "failed": []}  # steps 12, 24 and the last, 30
    assert sorted(os.listdir(tmp_path)) == ["model"]  # the snapshots are gone
    p = het("predict", out, "--data", "synthetic-criteo", "--samples", "4000", "--json", "--quiet")
    assert round(p["auc"], 4) == round(s["auc"], 4) and p["rows"] == 4000


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    one_line_refusal(run("export", str(tmp_path / "nothing"), str(tmp_path / "out")), "export",
                     "expected a checkpoint directory")
    assert not os.path.exists(tmp_path / "out")
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    one_line_refusal(run("predict", str(tmp_path), "--data", str(tmp_path / "x.csv")), "predict",
                     "expected an export directory holding export.json")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exp")
    het("train", "--steps", "5", "--workers", "1", "--synthetic-cap", "500", "--dim", "8", "--eval-samples", "0",
        "--checkpoint", str(tmp / "ck"), "--checkpoint-every", "5", "--json")
    het("export", str(tmp / "ck"), str(tmp / "model"), "--json", "--quiet")
    return tmp / "model"


def test_predict_refuses_input_it_cannot_read_in_one_line(tmp_path, exported):
    (tmp_path / "few.csv").write_text("I1,C1\n1,2\n")
    one_line_refusal(run("predict", str(exported), "--data", str(tmp_path / "few.csv")), "predict",
                     "column(s) ['I2'")
    one_line_refusal(run("predict", str(exported), "--data", "table:" + str(tmp_path)), "predict",
                     "this export was trained on synthetic-criteo")
    one_line_refusal(run("predict", str(exported), "--data", "synthetic-criteo", "--out", str(tmp_path / "s.txt")),
                     "predict", "--out must end in .csv or .parquet")


def test_export_refuses_a_damaged_checkpoint_in_one_line_naming_the_file_and_bytes(tmp_path, exported):
    import shutil
    import zipfile

    from het.files import member_offset

    ck = tmp_path / "ck"
    shutil.copytree(exported.parent / "ck", ck)
    save = ck / "ps" / "shard-0.pt"
    with open(save, "rb") as f, zipfile.ZipFile(f) as z:
        rows = max(z.infolist(), key=lambda i: i.file_size)  # the table's rows
        at = member_offset(f, rows) + rows.file_size // 2
    data = bytearray(save.read_bytes())
    data[at] ^= 0x40
    save.write_bytes(bytes(data))
    out = run("export", str(ck), str(tmp_path / "model"))
    one_line_refusal(out, "export", f"{save}: ")
    assert "damaged" in out.stderr and "bytes" in out.stderr and not (tmp_path / "model").exists()


@pytest.mark.slow
def test_a_table_four_times_the_memory_limit_exports_and_scores_under_it(tmp_path):
    """A fixed table of 1.1 GiB (2.2M rows of 128 floats) exported and scored by processes allowed
    256 MiB of data beyond what a het command holds once imported: the rows stream through
    read-only maps. (Scoring batches of 1,024 rows: a WDL batch of 4,096 at dim 128 holds about
    250 MB of rows and activations, whatever the table's size.)"""
    import torch

    from het.config import TableConfig
    from het.ps.local import local_client
    from het.train import checkpoint
    from het.train.config import TrainConfig
    from types import SimpleNamespace

    dim = 128
    base = _data_after_import()
    limit = base + (256 << 20)
    cfg = TrainConfig.from_dict({"dim": dim, "synthetic": {"cap": None, "scale": 0.066}})  # 2.2M keys
    from het.train.tasks import CTRTask, job_tables

    task = CTRTask(cfg)
    tables = job_tables(cfg, task)
    assert tables[0].rows * dim * 4 >= 4 * (256 << 20)
    model = task.build_model(torch.nn.Embedding(1, dim))
    worker = SimpleNamespace(rank=0, world=1, cfg=cfg, model=model, embedding=SimpleNamespace(flush=lambda: None),
                             dense=SimpleNamespace(state_dict=dict), client=local_client(tables))
    checkpoint.save(worker, str(tmp_path / "ck"), 1)
    worker.client.close()
    del worker
    out = run("export", str(tmp_path / "ck"), str(tmp_path / "model"), "--json", "--quiet", limit_bytes=limit)
    assert out.returncode == 0, out.stderr[-2000:]
    scored = run("predict", str(tmp_path / "model"), "--data", "synthetic-criteo", "--samples", "20000", "--batch", "1024", "--json",
                 "--quiet", limit_bytes=limit)
    assert scored.returncode == 0, scored.stderr[-2000:]


def _data_after_import() -> int:
    """Bytes of data a fresh `het` command holds once its modules are imported (VmData)."""
    code = ("import het.cli, het.export.writer, het.export.predict\nhet.cli.parser()\n"
            "print([l for l in open('/proc/self/status') if l.startswith('VmData')][0].split()[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) * 1024
