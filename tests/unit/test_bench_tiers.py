"""`het bench tiers`'s pure parts: the speed window, the figures against the budget, the plot,
and a run whose two jobs are fabricated summaries (no process is started)."""

import pytest

from het import cli
from het.bench import tiers

GIB = 1 << 30


def timeline(minutes: float, rate: float, rows_per_min: float, rss: float, on_disk_after: float | None = None):
    """One entry every 10 s of ``minutes``: ``rate`` samples/s, rows growing linearly; past
    ``on_disk_after`` minutes the rows beyond that point's are on disk."""
    out = []
    for i in range(1, int(minutes * 6) + 1):
        t = 10.0 * i
        rows = int(rows_per_min * t / 60)
        kept = rows if on_disk_after is None else min(rows, int(rows_per_min * on_disk_after))
        out.append({"t_s": t + 0.01, "step": 5 * i, "samples_per_s": rate, "rss_bytes": int(rss), "rss_bytes_sum": int(rss),
                    "rows": rows, "rows_in_memory": kept, "rows_on_disk": rows - kept, "disk_bytes": (rows - kept) * 300})
    return out


def summary(entries, rows, bytes_, servers=1):
    return {"steps": entries[-1]["step"], "samples_per_s": entries[0]["samples_per_s"], "wall_s": entries[-1]["t_s"],
            "auc": 0.7, "planted_auc": 0.8, "servers": servers, "stopped_at_step": entries[-1]["step"],
            "ps": {"rows": rows, "bytes": bytes_, "sampled_peak_rss_bytes": max(e["rss_bytes"] for e in entries)},
            "timeline": entries}


def test_the_speed_window_weights_each_interval_and_stops_at_the_first_entry_past_it():
    entries = [{"t_s": 10.2, "samples_per_s": 100}, {"t_s": 20.1, "samples_per_s": 40},
               {"t_s": 30.05, "samples_per_s": 10}, {"t_s": 40.0, "samples_per_s": 1}]
    assert tiers.rate_over(entries, 30) == pytest.approx((100 * 10.2 + 40 * 9.9 + 10 * 9.95) / 30.05)
    assert tiers.rate_over(entries, 1e9) == pytest.approx((1020 + 396 + 99.5 + 1 * 9.95) / 40.0)
    assert tiers.rate_over([], 300) is None


def test_the_figures_against_the_budget():
    budget = 2 * GIB
    tiered = summary(timeline(20, 500, 1e6, budget + 0.5 * GIB, on_disk_after=5), rows=20_000_000, bytes_=1)
    baseline = summary(timeline(5, 1000, 1e6, 3 * GIB), rows=5_000_000, bytes_=5_000_000 * 600)
    c = tiers.compare(tiered, baseline, budget, window_s=300)
    assert c["speed_ratio_first_5min"] == pytest.approx(0.5) and c["window_s"] == 300
    assert c["peak_rows"] == 20_000_000 and c["bytes_per_row"] == 600
    assert c["touched_over_budget"] == pytest.approx(20_000_000 * 600 / budget)
    assert c["max_rss_over_budget_bytes"] == int(0.5 * GIB)
    on_two = tiers.compare({**tiered, "servers": 2}, baseline, budget, window_s=300)  # the budget is a shard's
    assert on_two["touched_over_budget"] == pytest.approx(c["touched_over_budget"] / 2)
    no_rows = {**baseline, "ps": {"rows": 0, "bytes": 0}}
    fallback = tiers.compare({**tiered, "ps": {"rows": 10, "bytes": 1000, "disk_bytes": 5000}}, no_rows, budget, 300)
    assert fallback["bytes_per_row"] == 600 and "tiered" in fallback["bytes_per_row_from"]


def test_a_run_of_fabricated_jobs_gives_the_result_and_the_plot(tmp_path, monkeypatch):
    budget = 2 * GIB
    jobs = {True: summary(timeline(20, 500, 1e6, budget + 0.3 * GIB, on_disk_after=5), 20_000_000, 1),
            False: summary(timeline(5, 1000, 1e6, 3 * GIB), 5_000_000, 5_000_000 * 600)}
    ran = []
    monkeypatch.setattr(tiers, "run_job", lambda args, timeout_s: ran.append(args) or jobs["--shard-memory" in args])
    plot = tmp_path / "img" / "tiers.png"
    result = tiers.run(minutes=20, baseline_minutes=5, ps_memory="2GiB", plot=str(plot), extra=["--workers", "1"],
                       say=lambda line: None)
    assert ran == [tiers.job_args(20, "2GiB", ["--workers", "1"]), tiers.job_args(5, None, ["--workers", "1"])]
    assert "--shard-memory" not in ran[1] and ran[1][ran[1].index("--time-limit") + 1] == "300"
    assert result["budget_bytes"] == budget and result["speed_ratio_first_5min"] == pytest.approx(0.5)
    assert result["tiered"]["planted_auc"] == 0.8 and len(result["tiered"]["timeline"]) == 120
    assert plot.stat().st_size > 10_000 and result["plot"] == str(plot)


def test_the_command_is_registered_and_refuses_a_bad_budget_before_any_job(capsys):
    args = cli.parser().parse_args(["bench", "tiers", "--minutes", "1", "--extra=--workers 1", "--json"])
    assert (args.minutes, args.baseline_minutes, args.ps_memory, args.extra) == (1.0, 5.0, "2GiB", "--workers 1")
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "tiers", "--shard-memory", "2 potatoes"])
    assert e.value.code == 2 and "expected a size such as 2GiB" in capsys.readouterr().err
    with pytest.raises(ValueError, match="more than 0 bytes"):
        tiers.run(ps_memory="0", plot=None)
