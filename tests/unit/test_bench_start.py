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


@pytest.mark.parametrize("argv, says", [(["--runs", "0"], "--runs and --steps must be >= 1"),
                                        (["--vs", "/nonexistent"], "--vs expects a checkout of het")])
def test_bad_arguments_are_one_line_and_exit_code_2(argv, says, capsys):
    from het import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "start", *argv])
    assert e.value.code == 2 and says in capsys.readouterr().err
