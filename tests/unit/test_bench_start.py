"""`het bench start`: a small job's seconds to its first step, from its progress bar."""

import pytest

from het.bench import start

pytestmark = pytest.mark.cluster


def test_a_jobs_first_step_comes_before_its_end_and_its_shard_memory_is_read():
    flags = ["--steps", "3", "--synthetic-cap", "1000", "--dim", "8", "--batch", "64", "--eval-samples", "1000"]
    result = start.run(flags, runs=1, vs=None)
    here = result["here"]
    assert 0 < here["first_step_s"]["median"] < here["wall_s"]["median"]
    assert here["shard_peak_rss_bytes"]["median"] > 10 << 20


def test_a_failing_job_is_named():
    with pytest.raises(RuntimeError, match="failed"):
        start.first_step(["python", "-c", "import sys; sys.exit(3)"])
