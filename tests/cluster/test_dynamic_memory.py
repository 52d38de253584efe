"""A dynamic table's memory, measured in a shard process: it follows the rows pushed."""

import pytest

from het.bench.memory import run

pytestmark = pytest.mark.cluster


def test_a_shard_holds_about_the_rows_it_was_pushed_and_a_fixed_table_over_int64_cannot_exist():
    """400k distinct keys from the whole int64 range, dim 64, Adagrad: the shard's RSS grows by
    at most 1.3x the rows plus their optimizer state, and so does its own byte account
    (docs/RESULTS.md has the 1M-key figures of `het bench memory`)."""
    r = run(keys=400_000, dim=64, optimizer="adagrad", passes=2)
    assert r["rows"] == 400_000
    assert 1.0 < r["bytes_ratio"] <= 1.3, r
    assert 0.9 < r["rss_ratio"] <= 1.3, r
    assert r["fixed_table"].startswith("refused"), r
