"""``het bench staleness``: the paper's Table 2, AUC against the staleness bound.

The same job (mode ``het``, same seed, same samples: rank r's batch of step t is batch
``t * W + r`` of one deterministic stream) is trained once per bound ``s`` on a local cluster
over loopback, and each run's held-out AUC and log loss are reported beside the planted model's
AUC, the best any model can reach on the synthetic data (the same for every run: one held-out
set). The paper, after a full Criteo epoch on 8 workers, reports for Wide&Deep
s = 0 / 100 / 10^4 / inf: AUC 79.64 / 79.62 / 78.84 / 74.61.

Example (the last line of stdout is the JSON object)::

    het bench staleness --stalenesses 0,100,10000,inf --steps 1000 --workers 2 --json

The gap as a function of steps: ``--eval-curve N`` evaluates every N steps as well, and the
table gives each bound's AUC and gap by step. The paper's run is one Criteo epoch, about 44k
steps, so s = 100 is 0.23% of it: ``--steps 44000 --eval-curve 4000`` puts s = 100 in that
proportion (about 25 minutes a bound on 2 cores).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile

from het.staleness import format_staleness, parse_stalenesses
from het.train.config import TrainConfig
from het.train.flags import add_config_flags, config_from_args

DEFAULT_STALENESSES = "0,100,10000,inf"
RESULT_KEYS = ("auc", "logloss", "planted_auc", "samples", "hit_rate", "stale_refreshes", "drift",
               "sparse_bytes_per_sample", "samples_per_s", "wall_s", "curve")


def run(base: TrainConfig, stalenesses: list[float], log_dir: str | None = None, progress: bool = False) -> dict:
    """Train ``base`` in mode ``het`` once per bound in ``stalenesses``; Table 2 as a dict.

    Every run has ``base``'s seed, steps, batch and workers, so all see the same samples and
    are evaluated on the same held-out set; only the bound changes. Runs on loopback (no
    network namespace); each run's logs go to ``log_dir/s<bound>``.

    Returns:
        ``{"bench": "staleness", "log_dir", "config", "results": [{"staleness", "auc",
        "logloss", "planted_auc", "samples", "hit_rate", "stale_refreshes", "samples_per_s",
        "wall_s"}, ...]}``: one result per bound, in the order given (``staleness`` is an int or
        ``"inf"``; a metric the evaluation did not give is None); ``config`` is ``base``'s,
        mode ``het``, without a staleness.
    """
    from het.train.local import run_local

    if not stalenesses:
        raise ValueError("expected at least one staleness bound, got none")
    if base.is_graph:
        raise ValueError(f"het bench staleness trains a CTR model (AUC), got model {base.model!r}")
    if not base.eval_samples:
        raise ValueError("het bench staleness compares AUCs: eval_samples must be > 0, got 0")
    log_dir = log_dir or tempfile.mkdtemp(prefix="het-staleness-")
    results = []
    for s in stalenesses:
        cfg = dataclasses.replace(base, mode="het", staleness=s)  # validated again by __post_init__
        label = format_staleness(cfg.staleness)
        summary = run_local(cfg, os.path.join(log_dir, f"s{label}"), progress=progress)
        results.append({"staleness": label, **{k: summary.get(k) for k in RESULT_KEYS}})
    config = {k: v for k, v in base.to_dict().items() if k != "staleness"} | {"mode": "het"}
    return {"bench": "staleness", "log_dir": log_dir, "config": config, "results": results}


def format_table(result: dict) -> str:
    """The results as a readable table, the planted AUC beside each run's."""
    cfg = result["config"]
    rows = [f"AUC after {result['results'][0]['samples']:,} samples ({cfg['model']}, {cfg['workers']} workers, "
            f"batch {cfg['batch']}, dim {cfg['dim']}, seed {cfg['seed']}); logs in {result['log_dir']}",
            f"{'s':>6} {'AUC':>7} {'planted':>7} {'gap':>7} {'logloss':>7} {'hit rate':>8} {'stale refr.':>11} "
            f"{'samples/s':>10}"]
    for r in result["results"]:
        auc, planted = _num(r["auc"]), _num(r["planted_auc"])
        rows.append(f"{r['staleness']!s:>6} {auc:>7.4f} {planted:>7.4f} {planted - auc:>7.4f} "
                    f"{_num(r['logloss']):>7.4f} {_num(r['hit_rate']):>8.3f} {r['stale_refreshes'] or 0:>11,} "
                    f"{_num(r['samples_per_s']):>10,.0f}")
    rows += _curve_table(result["results"])
    return "\n".join(rows)


def _curve_table(results: list[dict]) -> list[str]:
    """With ``--eval-curve``: AUC by step for each bound, and each bound's gap to the first's."""
    if not all(r.get("curve") for r in results):
        return []
    first = {p["step"]: p.get("auc") for p in results[0]["curve"]}
    rows = ["", f"{'step':>6} " + " ".join(f"{'s=' + str(r['staleness']):>9} {'gap':>8}" for r in results)]
    for i, step in enumerate(first):
        cells = []
        for r in results:
            auc = _num(r["curve"][i].get("auc")) if i < len(r["curve"]) else math.nan
            cells.append(f"{auc:>9.4f} {auc - _num(first[step]):>+8.4f}")
        rows.append(f"{step:>6} " + " ".join(cells))
    return rows


def _num(x) -> float:
    return math.nan if x is None else float(x)


def add_parser(bsub) -> None:
    """Register ``het bench staleness`` on the subparsers of ``het bench``."""
    p = bsub.add_parser("staleness", help="AUC after the same samples for several staleness bounds (Table 2)",
                        description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--stalenesses", default=DEFAULT_STALENESSES,
                   help=f"comma-separated bounds, integers >= 0 or inf (default {DEFAULT_STALENESSES})")
    p.add_argument("--log-dir", help="where each run's logs go (default: a new temporary directory)")
    p.add_argument("--json", action="store_true", help="the last line of stdout is the result as JSON")
    add_config_flags(p, exclude=("mode", "staleness"))
    p.set_defaults(func=_main)


def _main(args) -> None:
    import json

    from het.dist.launch import ClusterError

    stalenesses = parse_stalenesses(args.stalenesses)  # bad input fails before anything starts
    base = config_from_args(args)
    try:
        result = run(base, stalenesses, args.log_dir)
    except ClusterError as e:
        raise SystemExit(f"het bench staleness: {e}") from None
    if args.json:
        print(json.dumps(result, sort_keys=True, default=str))
    else:
        print(format_table(result))
