"""``het bench missrate`` (Fig. 8) on tiny traces: every policy at every size, Belady the floor."""

import json

import pytest
import torch

from het.bench import missrate
from het.data.zipf import zipf_keys

FRACS = (0.03, 0.05, 0.10, 0.15)
CTR_FRACS = (0.005, 0.01, 0.02)  # of 840,543 rows: small enough that 6 steps' ~20,000 keys evict


@pytest.fixture(scope="module")
def result():
    graph = missrate.run(traces=("graph",), fracs=FRACS, batches=12, lookahead=2, graph="synthetic-graph:3000",
                         seeds_per_batch=32, dim=4)
    ctr = missrate.run(traces=("ctr",), fracs=CTR_FRACS, batches=6, batch=512, dim=4)
    graph["results"] += ctr["results"]
    graph["traces"].update(ctr["traces"])
    return graph


def _fracs(trace):
    return FRACS if trace == "graph" else CTR_FRACS


def test_every_policy_at_every_size(result):
    for trace in ("ctr", "graph"):
        for frac in _fracs(trace):
            rows = {r["policy"]: r for r in result["results"] if r["trace"] == trace and r["frac"] == frac}
            lookahead = {"lfu+lookahead"} if trace == "graph" else set()
            assert set(rows) == {"lru", "lfu", "belady", "static-oracle"} | lookahead, (trace, frac)
            assert len({r["capacity"] for r in rows.values()}) == 1
            assert all(0.0 <= r["miss_rate"] <= 1.0 for r in rows.values())
            belady = rows["belady"]["miss_rate"]
            assert belady <= rows["lru"]["miss_rate"] and belady <= rows["lfu"]["miss_rate"], (trace, frac, rows)
            if lookahead:
                assert rows["lfu+lookahead"]["lookahead"] == 2


def test_capacity_is_the_fraction_of_the_table(result):
    nodes, table = result["traces"]["graph"]["nodes"], result["traces"]["ctr"]["rows"]
    assert nodes == 3000 and table > 100_000
    assert result["traces"]["ctr"]["distinct_keys"] > max(CTR_FRACS) * table  # every ctr size evicts
    caps = {(r["trace"], r["frac"]): r["capacity"] for r in result["results"]}
    assert caps["graph", 0.10] == 300 and caps["ctr", 0.01] == round(0.01 * table)


def test_belady_never_rises_with_cache_size(result):
    for trace in ("ctr", "graph"):
        rates = [next(r["miss_rate"] for r in result["results"]
                      if (r["trace"], r["frac"], r["policy"]) == (trace, f, "belady")) for f in _fracs(trace)]
        assert rates == sorted(rates, reverse=True), (trace, rates)


def test_result_is_one_json_object_with_the_trace_parameters(result):
    back = json.loads(json.dumps(result))
    assert back["bench"] == "missrate" and back["fracs"] == list(FRACS) and back["lookahead"] == 2
    assert {r["trace"] for r in back["results"]} == {"ctr", "graph"}
    assert back["traces"]["graph"]["fanouts"] == [10, 5] and back["traces"]["ctr"]["batch"] == 512
    assert back["traces"]["graph"]["batches"] == 12 and back["traces"]["ctr"]["batches"] == 6


def test_belady_floor_and_monotone_on_a_zipf_trace():
    trace = zipf_keys(4000, 1.05, 256 * 40, seed=3)
    steps = [torch.unique(torch.from_numpy(trace[i:i + 256])) for i in range(0, len(trace), 256)]
    rows = missrate.measure(steps, 4000, fracs=(0.02, 0.05, 0.1, 0.2, 0.4), dim=4)
    by = {(r["policy"], r["frac"]): r["miss_rate"] for r in rows}
    belady = [by["belady", f] for f in (0.02, 0.05, 0.1, 0.2, 0.4)]
    assert belady == sorted(belady, reverse=True)
    assert all(by["belady", f] <= min(by["lru", f], by["lfu", f]) for f in (0.02, 0.05, 0.1, 0.2, 0.4))
    assert by["lfu", 0.05] < by["lru", 0.05]  # skewed: LFU misses less, as in the paper


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="expected a trace in ctr, graph, got 'criteo'"):
        missrate.load_trace("criteo", 10)
    with pytest.raises(ValueError, match=r"cache fraction must be in \(0, 1\], got 1.5"):
        missrate.measure([torch.tensor([1])], 10, fracs=(1.5,))


def test_cli_quick_parses():
    from het.cli import parser

    args = parser().parse_args(["bench", "missrate", "--quick", "--fracs", "0.05,0.1", "--traces", "graph",
                                "--lookahead", "4", "--json"])
    assert args.fracs == (0.05, 0.1) and args.traces == ("graph",) and args.quick and args.lookahead == 4
    with pytest.raises(SystemExit):
        parser().parse_args(["bench", "missrate", "--traces", "reddit"])
