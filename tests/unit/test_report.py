"""``het bench report``: rendering stored results (pure), the report region, the plots, and the
suite runner with a fake command runner (no processes)."""

import json
import math

import pytest

from het.bench import report, report_md

MACHINE = {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "memory_bytes": 24 * 2**30, "torch": "2.13.0",
           "python": "3.11.7", "system": "Linux", "date": "2025-01-01T10:00:00+00:00"}


def _summary(bandwidth, mode, s, samples_per_s, sparse, dense, split):
    return {"bandwidth": bandwidth, "mode": mode, "staleness": s, "workers": 2, "servers": 1, "steps": 300, "batch": 512,
            "samples": 307200, "wall_s": 307200 / samples_per_s, "samples_per_s": samples_per_s,
            "hit_rate": 0.767 if mode == "het" else 0.0, "sparse_bytes_per_sample": sparse,
            "dense_bytes_per_sample": dense, "bytes": {"dense": dense * 307200},
            "time_split": dict(zip(("compute", "wait_ps", "allreduce"), split))}


def e2e_result():
    rows = [_summary("1gbit", "ps", 0, 7200, 10833, 2206, (0.25, 0.75, 0.0)),
            _summary("1gbit", "hybrid", 0, 7260, 10833, 1084, (0.20, 0.71, 0.09)),
            _summary("1gbit", "het", 10, 21500, 3707, 1084, (0.59, 0.14, 0.27)),
            _summary("1gbit", "het", 100, 23800, 2723, 1084, (0.61, 0.14, 0.25)),
            _summary("none", "hybrid", 0, 17400, 10833, 1084, (0.45, 0.43, 0.13)),
            _summary("none", "het", 100, 25600, 2723, 1084, (0.67, 0.09, 0.24))]
    for r in rows:
        ref = next(x for x in rows if x["bandwidth"] == r["bandwidth"] and x["mode"] == "het" and x["staleness"] == 100)
        r["speed_vs_het100"] = r["samples_per_s"] / ref["samples_per_s"]
    return {"bench": "e2e", "log_dir": "/tmp/x", "results": rows}


def staleness_result():
    aucs = {0: 0.7910, 100: 0.7905, 10000: 0.7850, "inf": 0.7600}
    return {"bench": "staleness", "log_dir": "/tmp/s",
            "config": {"model": "wdl", "workers": 2, "batch": 512, "dim": 128, "seed": 0, "mode": "het"},
            "results": [{"staleness": s, "auc": a, "logloss": 0.45, "planted_auc": 0.8149, "samples": 1024000,
                         "hit_rate": 0.8, "stale_refreshes": 1000, "samples_per_s": 23000.0, "wall_s": 44.0}
                        for s, a in aucs.items()]}


def missrate_result(lookahead=4):
    rates = {"ctr": {"lru": (0.40, 0.33, 0.27, 0.23), "lfu": (0.36, 0.30, 0.25, 0.21),
                     "lfu+lookahead": (0.35, 0.29, 0.24, 0.20), "belady": (0.30, 0.25, 0.20, 0.17),
                     "static-oracle": (0.25, 0.20, 0.13, 0.10)},
             "graph": {"lru": (0.88, 0.83, 0.73, 0.65), "lfu": (0.80, 0.74, 0.64, 0.57),
                       "lfu+lookahead": (0.78, 0.72, 0.62, 0.55), "belady": (0.64, 0.56, 0.45, 0.37),
                       "static-oracle": (0.74, 0.68, 0.57, 0.50)}}
    rows = {"ctr": 840543, "graph": 200000}
    results = [{"trace": t, "frac": f, "capacity": round(f * rows[t]), "policy": p, "miss_rate": v[i]}
               for t, by in rates.items() for p, v in by.items() for i, f in enumerate(report.PAPER_FRACS)]
    return {"bench": "missrate", "fracs": list(report.PAPER_FRACS), "lookahead": lookahead, "dim": 16,
            "traces": {"ctr": {"batch": 512, "batches": 1000, "rows": 840543},
                       "graph": {"graph": "synthetic-graph:200000", "fanouts": [10, 5], "seeds_per_batch": 64,
                                 "batches": 300, "nodes": 200000}},
            "results": results}


def scale_result():
    measured = [{"mode": m, "workers": w, "dim": d, "bandwidth": "none", "samples_per_s": sps, "wall_s": 10.0,
                 "steps": 200, "batch": 512, "time_split": {"compute": 0.7, "wait_ps": 0.1, "allreduce": 0.2},
                 "hit_rate": 0.8, "sparse_bytes_per_sample": 2700.0, "dense_bytes_per_sample": 1084.0, "threads": 1,
                 "cpu_bound": w > 2}
                for m, w, d, sps in (("het:100", 1, 128, 15000.0), ("het:100", 2, 128, 24000.0),
                                     ("het:100", 3, 128, 22000.0), ("ps", 1, 128, 14000.0), ("ps", 2, 128, 20000.0),
                                     ("het:100", 2, 512, 9000.0), ("ps", 2, 512, 7000.0))]
    check = [{"mode": m["mode"], "workers": m["workers"], "dim": 128, "measured_samples_per_s": m["samples_per_s"],
              "predicted_samples_per_s": m["samples_per_s"] * 1.1, "predicted_uncontended_samples_per_s": 1.0,
              "rel_error": 0.1, "contention": 1.0, "cpu_bound": m["cpu_bound"], "reference": m["workers"] == 2}
             for m in measured if m["dim"] == 128]
    projected = [{"sweep": "workers", "mode": m, "workers": w, "dim": 128, "bandwidth": b, "dense_params": 300000,
                  "step_s": 0.05, "samples_per_s": w * 512 / (0.02 + (0.002 if m == "ps" else 0.001) * w * (2 if b == "1gbit" else 1))}
                 for m in ("het:100", "ps") for b in ("none", "1gbit") for w in (1, 2, 4, 8, 16, 32)]
    projected += [{"sweep": "dim", "mode": m, "workers": 8, "dim": d, "bandwidth": b, "samples_per_s":
                   8 * 512 / (0.02 + d * (4e-5 if m == "ps" else 2e-6) * (2 if b == "1gbit" else 1))}
                  for m in ("het:100", "ps") for b in ("none", "1gbit") for d in (128, 512, 4096)]
    return {"bench": "scale", "cores": 2, "reference_workers": 2, "threads": {"1": 1, "2": 1, "3": 1},
            "note": "2 cores: runs with workers x threads > cores (2) share the CPUs", "bandwidth": "none",
            "config": {"dim": 128, "batch": 512}, "log_dir": "/tmp/sc",
            "model": {"formula": "t(W) = t_c + o_ps + wire_ps(W)", "assumptions": ["one worker per machine"],
                      "params": {}},
            "measured": measured, "check": check, "projected": projected}


def record(name, result, quick=False):
    return {"name": name, "command": f"het bench {name} --json", "quick": quick, "machine": MACHINE,
            "started": "2025-01-01T10:00:00+00:00", "seconds": 12.5, "returncode": 0, "result": result}


@pytest.fixture
def records():
    return {"e2e": record("e2e", e2e_result()), "staleness": record("staleness", staleness_result()),
            "missrate": record("missrate", missrate_result()), "scale": record("scale", scale_result(), quick=True)}


def test_render_has_one_table_per_figure_with_command_machine_and_paper(records):
    md = report.render(records, {"missrate": "img/fig8_missrate.png"})
    for title in ("Fig. 7 / Table 1", "Table 2", "Fig. 8", "Fig. 9"):
        assert f"### {title}" in md
    for name in records:
        assert f"Command: `het bench {name} --json`" in md
    assert md.count("Machine: Intel(R) Xeon(R) Processor, 2 cores, 24 GiB, torch 2.13.0") == 4
    assert "| 1 Gbit | het s=100 | 23,800 | 1.00 | 2,723 |" in md
    assert "0.7964" in md and "0.7461" in md                    # the paper's WDL row beside Table 2
    assert "| 10% | 84,054 | 0.270 | 0.250 | 0.240 | 0.200 | 0.130 | 0.35 / 0.28 | 0.14 / 0.12 |" in md
    assert "LFU + lookahead 4" in md and "![Fig. 8](img/fig8_missrate.png)" in md
    assert "the projection `het/bench/scale.py` documents" in md and "(quick run)" in md
    assert "22.8x" in md                                        # the paper's Fig. 9 beside


def test_checks_are_computed_and_honest(records):
    checks = report.all_checks(records)
    text = "\n".join(checks)
    assert "e2e: het s=100 vs hybrid at 1 Gbit: 3.3x (target >= 5x): short" in text
    assert "het s=100 vs ps at 1 Gbit: 3.3x (target >= 10x): short" in text
    assert "cut vs hybrid at 1 Gbit: 74.9% (target >= 88%, the paper's figure): short" in text
    assert "where the time goes at 1 Gbit, ms per step (compute / PS wait / AllReduce): het s=100" in text
    assert "staleness: AUC s=100 - s=0 = -0.0005 (target >= -0.0008; paper WDL -0.0002): met" in text
    costly = staleness_result()
    costly["results"][1]["auc"] = 0.7883  # HET's rule under Adagrad: -0.0027
    assert "AUC s=100 - s=0 = -0.0027 (target >= -0.0008; paper WDL -0.0002): missed" in \
        report_md.checks_staleness(costly)
    assert "LFU <= LRU at every size (ctr): yes" in text and "LFU <= LRU at every size (graph): yes" in text
    assert "Belady <= LFU at every size (graph): yes" in text
    assert "scale: model vs measured" in text and "projected het s=100 vs ps at dim 4096" in text
    worse = missrate_result()
    worse["results"] = [dict(r, miss_rate=0.99) if (r["policy"], r["frac"]) == ("lfu", 0.05) else r
                        for r in worse["results"]]
    assert "LFU <= LRU at every size (ctr): no" in report.checks_missrate(worse)


def test_failed_and_missing_runs_are_reported_not_rendered(records):
    failed = dict(record("e2e", None), returncode=1,
                  error="het bench e2e: cannot emulate a cluster network here: needs root")
    md = report.render({"e2e": failed})
    assert "**Not measured**" in md and "cannot emulate" in md
    assert "Not measured yet: `het bench report --run --only staleness`" in md
    assert report.all_checks({"e2e": failed}) == [("e2e: not measured (het bench e2e: cannot emulate a cluster "
                                                  "network here: needs root)")]


def test_a_result_of_another_shape_does_not_break_the_report():
    odd = {"bench": "scale", "measured": [{"workers": 1, "rate": 5.0}], "check": ["fits"], "projected": []}
    md = report.render({"scale": record("scale", odd), "staleness": record("staleness", {"results": [{}]})})
    assert "| workers | rate |" in md and "- fits" in md
    assert "Could not render this result (KeyError" in md


def test_region_is_replaced_and_the_rest_untouched():
    hand = "# Results\n\nHand-written.\n\n"
    once = report.update_region(hand, "first")
    assert once.startswith(hand) and once.endswith(f"{report.BEGIN}\nfirst\n{report.END}\n")
    twice = report.update_region(once + "\nAfter, by hand.\n", "second")
    assert twice == f"{hand}{report.BEGIN}\nsecond\n{report.END}\n\nAfter, by hand.\n"
    assert report.update_region(twice, "second") == twice


def test_write_report_writes_region_and_valid_pngs(tmp_path, records):
    results, img, doc = tmp_path / "results", tmp_path / "img", tmp_path / "RESULTS.md"
    results.mkdir()
    for name, rec in records.items():
        (results / f"{name}.json").write_text(json.dumps(rec))
    doc.write_text("# Results\n\nKeep me.\n")
    checks = report.write_report(str(results), str(doc), str(img))
    text = doc.read_text()
    assert text.startswith("# Results\n\nKeep me.\n") and text.count(report.BEGIN) == 1
    assert "![Fig. 7](img/fig7_e2e.png)" in text and "![Fig. 9](img/fig9_scale.png)" in text
    for png in report.PLOTS.values():
        data = (img / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, png
    assert any("LFU <= LRU" in c for c in checks)


def test_run_suite_stores_records_and_failures(tmp_path):
    calls = []

    def fake(cmd, timeout_s):
        calls.append(cmd)
        if cmd[-2:] == ["e2e", "--json"]:
            return 1, "", "Traceback...\nhet bench e2e: cannot emulate a cluster network here: not root\n"
        return 0, "progress\n" + json.dumps({"bench": "missrate", "results": []}) + "\n", ""

    suite = [("e2e", ["e2e", "--bandwidths", "1gbit", "--json"], ["e2e", "--json"]),
             ("missrate", ["missrate", "--json"], ["missrate", "--quick", "--json"])]
    records = report.run_suite(str(tmp_path), quick=True, suite=suite, runner=fake, log=None)
    assert [c[-3:] for c in calls] == [["bench", "e2e", "--json"], ["missrate", "--quick", "--json"]]
    stored = json.loads((tmp_path / "missrate.json").read_text())
    assert stored["command"] == "het bench missrate --quick --json" and stored["quick"]
    assert stored["result"] == {"bench": "missrate", "results": []}
    assert set(stored) >= {"name", "command", "machine", "started", "seconds", "result"}
    assert set(stored["machine"]) >= {"cpu", "cores", "memory_bytes", "torch", "date"}
    failed = json.loads((tmp_path / "e2e.json").read_text())
    assert failed["result"] is None and failed["error"].startswith("het bench e2e: cannot emulate")
    assert records[0]["returncode"] == 1
    only = report.run_suite(str(tmp_path), only=["missrate"], suite=suite, runner=fake, log=None)
    assert [r["name"] for r in only] == ["missrate"] and calls[-1][-2:] == ["missrate", "--json"]
    with pytest.raises(ValueError, match="expected benchmarks among e2e, missrate, got nope"):
        report.run_suite(str(tmp_path), only=["nope"], suite=suite, runner=fake, log=None)


def test_suite_commands_parse_with_the_cli():
    from het.cli import parser

    p = parser()
    for name, argv, quick in report.SUITE:
        for a in (argv, quick):
            args = p.parse_args(["bench", *a])
            assert args.bench == name and args.json


def test_a_step_in_milliseconds_splits_as_the_time_split_says():
    ms = report_md.step_ms({"workers": 2, "batch": 512, "samples_per_s": 1024.0,
                            "time_split": {"compute": 0.5, "wait_ps": 0.3, "allreduce": 0.2}})
    assert ms == pytest.approx({"step": 1000.0, "compute": 500.0, "ps": 300.0, "allreduce": 200.0})
    assert report_md.step_ms({"samples_per_s": 0}) == {}


def test_staleness_labels():
    assert report_md._s_label("inf") == "inf" and report_md._s_label(100) == "100"
    assert report_md._staleness("inf") == math.inf
