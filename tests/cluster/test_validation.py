"""Validation and the kept model on a local cluster: the job ends with the model of its best
validation score, rows on the PS included, and stops early when asked."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

from het.data.table import TableSpec, prepare_table
from het.train import checkpoint
from jobs import het

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def noisy_table(tmp_path_factory):
    """A table whose labels are coin flips: a model can only overfit it, so validation's best
    comes early and the last step is worse."""
    d = tmp_path_factory.mktemp("noisy")
    rng = np.random.default_rng(0)
    n = 3000
    columns = {"y": rng.integers(0, 2, n), "x": rng.normal(size=n)}
    columns.update({f"c{j}": rng.integers(0, 400, n).astype(str) for j in range(4)})
    pcsv.write_csv(pa.table(columns), d / "t.csv")
    prepare_table(str(d / "t.csv"), str(d / "out"), TableSpec("y", ("x",), tuple(f"c{j}" for j in range(4))),
                  progress=False)
    return str(d / "out")


def _train(table, tmp_path, name, *flags):
    return het("train", "--model", "wdl", "--data", f"table:{table}", "--staleness", "0", "--batch", "64",
               "--dim", "8", "--lr", "0.5", "--dense-lr", "0.05", "--eval-samples", "100000", "--json", "--quiet",
               "--log-dir", str(tmp_path / name), *flags)


# with L2 as a decay the rows are read at the kept step once it is put back; without it, in make test-slow
@pytest.mark.parametrize("flags", [pytest.param((), marks=pytest.mark.slow), ("--row-l2", "0.2")])
def test_the_kept_model_is_the_validation_best_and_scores_as_it_did_when_kept(noisy_table, tmp_path, flags):
    ck, ex = tmp_path / "ck", tmp_path / "export"
    s = _train(noisy_table, tmp_path, "long", "--steps", "60", "--eval-every", "5", "--checkpoint", str(ck),
               "--export", str(ex), "--export-every", "30", *flags)
    v = s["validation"]
    best = min(v["curve"], key=lambda p: p["logloss"])
    assert v["best_step"] == best["step"] == s["best_step"] < 60  # chosen on validation, before the end
    assert v["curve"][-1]["step"] == 60 and v["curve"][-1]["logloss"] > best["logloss"]
    assert v["keeps"] >= 1
    assert checkpoint.saved_step(str(ck)) == s["best_step"]  # the checkpoint holds the kept model
    assert json.loads((ex / "export.json").read_text())["manifest"]["step"] == s["best_step"]  # and the export
    # the model put back, rows on the PS and dense layers, scores on validation as it did when kept
    assert v["restored"] == {k: val for k, val in best.items() if k != "step"}


@pytest.mark.slow  # two jobs: about 25 s
def test_patience_stops_the_job_and_epochs_count_passes(noisy_table, tmp_path):
    s = _train(noisy_table, tmp_path, "patient", "--steps", "400", "--eval-every", "5", "--patience", "2")
    v = s["validation"]
    assert v["stopped_early"] and s["stopped_at_step"] < 400
    assert s["stopped_at_step"] - v["best_step"] == 10  # two evaluations without a better one
    e = _train(noisy_table, tmp_path, "epochs", "--epochs", "2", "--eval-every", "0")
    train_rows = 3000 - round(3000 * 0.1)  # about: test and validation shares
    assert abs(e["steps"] - 2 * math.ceil(train_rows * 0.9 / 128)) <= 2
