"""`het bench profile`: where one worker's step spends its time, under cProfile.

One rank of a training job (any `het train` flags' job: model, data, mode, cache, lookahead)
runs in this process against in-process shards (no sockets, no AllReduce): ``--warmup`` steps
unprofiled, then ``--steps`` under cProfile, then the job's tail unprofiled. The tail is the last
``lookahead + 1`` steps (all but the last push idle rows, spreading the final flush over them),
then the flush itself;
each is timed apart (``tail_s_per_step``, ``flush_s``), as they are the end of training, not its
steady state. The result: seconds per step and the functions with the most time of their own
(``tottime``) and in total (``cumtime``), per step. The shard's work is in the profile too (an
in-process shard answers inside the client's send), under ``het/ps/server/shard.py`` and
``het/ps/server/store/optim.py``.

Compare configurations in one run of this command on the same machine, not across runs:
timings here are noisy.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import time

import torch

from het.ps.local import local_client
from het.train.config import TrainConfig
from het.train.flags import add_config_flags, config_from_args, overrides
from het.train.loop import Worker
from het.train.tasks import job_tables


def run(cfg: TrainConfig, steps: int = 200, warmup: int = 20, top: int = 20) -> dict:
    """Profile ``steps`` steps of one rank of ``cfg`` after ``warmup`` unprofiled ones, in one
    run that goes on past them through the job's tail (the last ``lookahead + 1`` steps and the
    final flush), unprofiled and timed apart.

    Returns ``{"s_per_step", "tail_steps", "tail_s_per_step", "flush_s", "steps",
    "het_ms_per_step", "het_fraction", "shard_ms_per_step", "worker_het_fraction",
    "by_tottime": [...], "by_cumtime": [...]}`` (``het_fraction``: of a step, the share in
    het's machinery, :func:`het_seconds`, the in-process shard's answers included;
    ``worker_het_fraction``: the same without the shard's answers, as a worker whose shards run
    elsewhere spends it), each row ``{"function", "calls_per_step", "tottime_ms_per_step",
    "cumtime_ms_per_step"}``.
    """
    if steps < 1 or warmup < 0 or top < 1:
        raise ValueError(f"steps >= 1, warmup >= 0 and top >= 1 expected, got {steps}, {warmup}, {top}")
    client = local_client(job_tables(cfg), cfg.servers, lazy_init=cfg.lazy_init)
    worker = Worker(cfg, client)
    # the tail: the steps that push idle rows (lookahead of them) and the last, after the window
    tail = worker.lookahead + 1 if worker.lookahead and not worker.bsp else 0
    profiler = cProfile.Profile()
    marks: dict = {}

    def window(done: int) -> None:  # after each step: the profiled steps are warmup + 1 .. warmup + steps
        if done == warmup + steps:
            profiler.disable()
            marks["end"] = time.perf_counter()
        if done == warmup:
            marks["start"] = time.perf_counter()
            profiler.enable()

    window(0)
    worker.train(warmup + steps + tail, 0, progress=False, on_step=window)  # the tail and flush unprofiled
    ended = time.perf_counter()
    if "end" not in marks:  # a time limit (or a signal) ended the job inside the window
        profiler.disable()
        raise ValueError(f"the job stopped after {worker.step_count} steps, before the {warmup + steps} the "
                         f"profile needs (warm-up {warmup}, then {steps}): a time limit too short? Nothing measured")
    wall, tail_ran = marks["end"] - marks["start"], worker.step_count - warmup - steps
    stats = pstats.Stats(profiler)
    het = het_seconds(stats)
    shard = sum(ct for (path, _, name), (_, _, _, ct, _) in stats.stats.items()
                if name == "handle_frames" and path.endswith(os.path.join("het", "ps", "server", "shard.py")))
    return {"s_per_step": wall / steps, "steps": steps, "warmup": warmup, "tail_steps": tail_ran,
            "tail_s_per_step": (ended - marks["end"] - worker.flush_s) / tail_ran if tail_ran else 0.0,
            "flush_s": worker.flush_s,
            "het_ms_per_step": 1e3 * het / steps, "het_fraction": het / wall,
            "shard_ms_per_step": 1e3 * shard / steps, "worker_het_fraction": (het - shard) / (wall - shard),
            "by_tottime": _rows(stats, "tottime", steps, top), "by_cumtime": _rows(stats, "cumtime", steps, top),
            "hit_rate": worker.embedding.total_stats().get("hit_rate", 0.0)}


# het's own machinery: what a plain torch.nn.Embedding job would not run (the model's code, the
# training loop, the input and the dense layers' synchronisation are the job's, not het's)
HET_PACKAGES = ("cache", "native", "nn", "ps", "staleness.py")


def is_het(func) -> bool:
    """Whether a profiled function (cProfile's ``(path, line, name)``) is het's machinery: a
    function of :data:`HET_PACKAGES`. The native operators are builtins, counted through
    their callers."""
    path = func[0].replace(os.sep, "/")
    return any(f"/het/{p}" in path for p in HET_PACKAGES)


def het_seconds(stats: pstats.Stats) -> float:
    """Seconds spent in het's machinery, everything it calls included (torch operators, the
    native core, an in-process shard), the caches' flush left out.

    Each call into het from outside it counts with all it calls. A call into het from a
    function that het itself called (autograd's ``apply`` running het's forward) is inside a
    call already counted: gprof's rule weights each outside caller by the share of its own time
    that het did not call, so nothing counts twice. A call whose caller the profile does not
    know (its frame began before the profiler was enabled) is from outside het."""
    entries = stats.stats
    under: dict = {}

    def share_under_het(func, depth=0) -> float:  # of func's time, the share spent called from het
        if is_het(func):
            return 1.0
        if func in under:
            return under[func]
        under[func] = 0.0  # a cycle back here adds nothing
        _, _, _, ct, callers = entries.get(func, (0, 0, 0, 0, {}))
        if ct <= 0 or not callers or depth > 50:
            return 0.0
        under[func] = min(1.0, sum(c[3] * share_under_het(caller, depth + 1) for caller, c in callers.items()) / ct)
        return under[func]

    total = 0.0
    for func, (_, _, _, func_ct, callers) in entries.items():
        if not is_het(func) or func[2] == "flush":
            continue
        for caller, (_, _, _, ct) in callers.items():
            if not is_het(caller):
                total += ct * (1.0 - share_under_het(caller))
        # calls with no caller on record come from a frame entered before the profiler started
        # (the training loop, for a window in the middle of a run): from outside het, whole
        total += max(0.0, func_ct - sum(c[3] for c in callers.values()))
    return total


def _rows(stats: pstats.Stats, key: str, steps: int, top: int) -> list[dict]:
    col = {"tottime": 2, "cumtime": 3}[key]
    ranked = sorted(stats.stats.items(), key=lambda kv: kv[1][col], reverse=True)[:top]
    return [{"function": _name(func), "calls_per_step": calls / steps,
             "tottime_ms_per_step": 1e3 * tt / steps, "cumtime_ms_per_step": 1e3 * ct / steps}
            for func, (_, calls, tt, ct, _) in ranked]


def _name(func) -> str:
    path, line, name = func
    if path == "~":
        return name  # a builtin: "<method 'index_add_' ...>"
    marker = f"{os.sep}het{os.sep}"
    short = path[path.rindex(marker) + 1:] if marker in path else os.path.basename(path)
    return f"{short}:{line}({name})"


def add_parser(bsub) -> None:
    """Register ``het bench profile`` on the subparsers of ``het bench``."""
    p = bsub.add_parser("profile", help="cProfile of one worker's steps (in-process shards): where a step's "
                        "time goes, per function")
    p.add_argument("--steps", type=int, default=200, help="profiled steps")
    p.add_argument("--warmup", type=int, default=20, help="unprofiled steps first")
    p.add_argument("--top", type=int, default=20, help="functions listed, per ranking")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--json", action="store_true", help="the last line of stdout is the result as JSON")
    add_config_flags(p, exclude=("steps", "checkpoint", "checkpoint_every", "resume"),
                     fixed={"eval_samples": 0, "workers": 1})
    p.set_defaults(func=_main)


def _main(args) -> None:
    torch.set_num_threads(args.threads)
    cfg = config_from_args(args)
    given = overrides(args)
    result = {"bench": "profile", "config": {k: given[k] for k in sorted(given)},
              **run(cfg, args.steps, args.warmup, args.top)}
    if args.json:
        print(json.dumps(result, sort_keys=True, default=str))
        return
    print(f"{1e3 * result['s_per_step']:.1f} ms per step over {args.steps} steps (hit rate "
          f"{result['hit_rate']:.3f}), then {result['tail_steps']} steps of the tail at "
          f"{1e3 * result['tail_s_per_step']:.1f} ms and {result['flush_s']:.2f} s of flush; het's machinery "
          f"{result['het_ms_per_step']:.1f} ms of "
          f"it ({result['het_fraction']:.0%}; {result['worker_het_fraction']:.0%} of a step without the in-process "
          f"shard's {result['shard_ms_per_step']:.1f} ms)")
    for key in ("tottime", "cumtime"):
        print(f"\nby {key} (ms per step):")
        for r in result[f"by_{key}"]:
            print(f"  {r[f'{key}_ms_per_step']:8.2f}  {r['calls_per_step']:7.1f} calls  {r['function']}")
