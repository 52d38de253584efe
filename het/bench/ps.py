"""``het bench ps``: rows per second through one shard over TCP loopback, beside raw ZeroMQ.

One step is a pull of ``batch`` rows and a push of ``batch`` gradients; the next step's pull is
sent before this step's push is waited for, as a training loop overlaps them. The raw figure
runs the same sizes with plain ZeroMQ in the same run: a request of the bytes a step sent
and a reply of the bytes it received, as the PS run measured them, to an echo process that
does nothing else. Bytes count
every frame both ways. ``ps_fraction = bytes_per_s / zmq_bytes_per_s``. The two take turns for
``--rounds`` rounds, as this machine's speed drifts over seconds: the figures are those of the
round whose ``cpu_over_zmq`` is the median (``cpu_over_zmq_rounds``: every round's).

Where a step goes: ``ms_per_step``; ``client_cpu_ms_per_step`` and ``shard_cpu_ms_per_step``,
each process's CPU (all its threads, ZeroMQ's I/O threads included); ``shard_busy_ms_per_step``,
the shard's handling of requests (its ``busy_s``, wall time); ``wait_pull_ms_per_step`` and
``wait_push_ms_per_step``, the client blocked on each. The raw run's the same:
``zmq_ms_per_round_trip``, ``zmq_client_cpu_ms_per_round_trip``,
``zmq_echo_cpu_ms_per_round_trip``. ``cpu_bound_ps_fraction``: the most ``ps_fraction`` that
``cores`` allow, given the CPU the two processes spent a step (``cpu_ms_per_step``): a step
cannot take less than that CPU shared out over the cores.

What the step's CPU is beside raw ZeroMQ's: ``cpu_over_zmq``, ``cpu_ms_per_step`` over
``zmq_cpu_ms_per_round_trip``; and the same messages as a step's, a pull's request and reply then
a push's, each of its own bytes, in the same run: ``zmq_pull_push_cpu_ms_per_step`` (raw ZeroMQ
with a PS that costs nothing but its messages) and ``cpu_over_zmq_pull_push``. Of each process's
CPU, the thread that makes or answers the requests (``*_main_cpu_*``: het's own work, or the raw
run's loop); the rest is ZeroMQ's I/O thread moving the bytes.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time

import numpy as np
import torch
import zmq

from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.client.client import PSClient
from het.ps.protocol.partition import mix
from het.ps.server.process import ServerProcess


def _echo(address_queue, reply_bytes: list, server_secret: bytes | None = None) -> None:
    """A ROUTER that answers a request tagged ``i`` with ``reply_bytes[i]`` bytes, until told
    'stop'; with a CURVE ``server_secret`` key, over ZeroMQ's CURVE security (encrypted,
    authenticated)."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    if server_secret is not None:
        sock.curve_server = True
        sock.curve_secretkey = server_secret
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    address_queue.put(f"tcp://127.0.0.1:{port}")
    payloads = [np.zeros(n, dtype=np.uint8) for n in reply_bytes]
    cpu0, main0 = time.process_time(), time.thread_time()
    while True:
        peer, *frames = sock.recv_multipart(copy=False)
        if bytes(frames[0]) == b"start":  # the clock starts: CPU seconds from here on
            cpu0, main0 = time.process_time(), time.thread_time()
            sock.send_multipart([peer, b"go"])
            continue
        if bytes(frames[0]) == b"stop":  # the echo's CPU seconds since "start": every thread's, this one's
            sock.send_multipart([peer, f"{time.process_time() - cpu0} {time.thread_time() - main0}".encode()])
            break
        sock.send_multipart([peer, payloads[int(bytes(frames[0]))]], copy=False)
    sock.close(linger=1000)


def raw_zmq(request_bytes: int, reply_bytes: int, seconds: float, curve: bool = False) -> dict:
    """Round trips of ``request_bytes`` out and ``reply_bytes`` back over a DEALER socket; with
    ``curve``, over ZeroMQ's CURVE security (every frame encrypted and authenticated)."""
    r = _exchanges([(request_bytes, reply_bytes)], seconds, curve)
    ms = 1e3 / r["rounds"]
    return {"zmq_bytes_per_s": r["moved"] / r["elapsed"], "zmq_round_trips": r["rounds"],
            "zmq_ms_per_round_trip": r["elapsed"] * ms, "zmq_client_cpu_ms_per_round_trip": r["cpu"] * ms,
            "zmq_echo_cpu_ms_per_round_trip": r["echo_cpu"] * ms,
            "zmq_client_main_cpu_ms_per_round_trip": r["main_cpu"] * ms,
            "zmq_echo_main_cpu_ms_per_round_trip": r["echo_main_cpu"] * ms}


def _exchanges(sizes: list, seconds: float, curve: bool = False) -> dict:
    """Rounds of the exchanges ``sizes`` ``[(request bytes, reply bytes), ...]`` in turn, two
    requests in flight, as the PS loop keeps them, for ``seconds``: the ``rounds``, the seconds
    (``elapsed``), the CPU seconds of this process and of the echo, every thread's (``cpu``,
    ``echo_cpu``) and the one making or answering requests' (``main_cpu``, ``echo_main_cpu``),
    and the bytes ``moved``."""
    server_public, server_secret = zmq.curve_keypair() if curve else (None, None)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_echo, args=(q, [rep for _, rep in sizes], server_secret), daemon=True)
    proc.start()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    if curve:
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        sock.curve_serverkey = server_public
    try:
        sock.connect(q.get(timeout=60))
        requests = [[str(i).encode(), np.ones(req, dtype=np.uint8)] for i, (req, _) in enumerate(sizes)]
        sock.send(b"start")
        sock.recv()
        moved, sent, replies, t0, cpu0, main0 = 0, 1, 0, time.perf_counter(), time.process_time(), time.thread_time()
        sock.send_multipart(requests[0], copy=False)
        while time.perf_counter() - t0 < seconds or replies < 3 * len(sizes) or replies % len(sizes):
            sock.send_multipart(requests[sent % len(sizes)], copy=False)
            sent += 1
            frames = sock.recv_multipart(copy=False)
            moved += len(requests[replies % len(sizes)][0]) + sizes[replies % len(sizes)][0] + len(frames[0].buffer)
            replies += 1
        sock.recv_multipart(copy=False)
        elapsed, cpu, main_cpu = time.perf_counter() - t0, time.process_time() - cpu0, time.thread_time() - main0
        sock.send(b"stop")
        echo_cpu, echo_main_cpu = map(float, sock.recv().split())
    finally:
        sock.close(linger=0)
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    return {"rounds": replies // len(sizes), "elapsed": elapsed, "cpu": cpu, "echo_cpu": echo_cpu,
            "main_cpu": main_cpu, "echo_main_cpu": echo_main_cpu, "moved": moved}


def run(batch: int = 4096, dim: int = 128, rows: int = 200_000, seconds: float = 5.0,
        optimizer: str = "sgd", curve: bool = False, dynamic: bool = False, rounds: int = 3) -> dict:
    """Pull + push ``batch`` random rows of ``dim`` floats through one shard process, and raw
    ZeroMQ of the same bytes, in turn for ``rounds`` rounds of ``seconds`` each, as this machine's
    speed drifts over seconds: the figures are the round's whose ``cpu_over_zmq`` is the median
    (every round's in ``cpu_over_zmq_rounds``). With ``curve``, also raw ZeroMQ of the same sizes
    under CURVE (``zmq_curve_bytes_per_s``, and ``curve_fraction`` of the plain figure: what
    encrypting every frame would cost). With ``dynamic``, each round also the same steps through a
    dynamic table whose keys are the same ids spread over the whole int64 range, on a second shard:
    ``dynamic_fraction`` is the median of the rounds' dynamic / fixed rows/s
    (``dynamic_fractions``). Both tables first take one push of every row, so every pull reads
    stored rows."""
    opt = OptimizerConfig(optimizer, lr=0.01)
    rng = torch.Generator().manual_seed(0)
    batches = [torch.randperm(rows, generator=rng)[:batch] for _ in range(64)]
    spread = [mix(b) for b in batches]  # the same ids, as raw 64-bit keys
    measured, fractions = [], []
    with contextlib.ExitStack() as stack:
        fixed_shard = stack.enter_context(_Shard(TableConfig("bench", rows=rows, dim=dim, optimizer=opt), rows))
        dyn_shard = stack.enter_context(_Shard(TableConfig("bench", rows=None, dim=dim, optimizer=opt), rows,
                                               ids=lambda k: mix(k))) if dynamic else None
        for _ in range(max(1, rounds)):
            fixed = fixed_shard.measure(batches, seconds)
            # a step's bytes each way as the PS run measured them, in one request and one reply
            sizes = {"request_bytes": fixed.pop("sent_per_step"), "reply_bytes": fixed.pop("received_per_step")}
            raw = raw_zmq(**sizes, seconds=seconds)
            measured.append((fixed, raw, sizes))
            if dyn_shard is not None:
                d = dyn_shard.measure(spread, seconds)
                fractions.append(d["rows_per_s"] / fixed["rows_per_s"])
        ratios = [_cpu_over_zmq(f, r) for f, r, _ in measured]
        fixed, raw, sizes = measured[sorted(range(len(ratios)), key=ratios.__getitem__)[(len(ratios) - 1) // 2]]
        two = _exchanges(fixed.pop("exchanges"), seconds)  # the step's own messages
        raw["zmq_pull_push_cpu_ms_per_step"] = (two["cpu"] + two["echo_cpu"]) * 1e3 / two["rounds"]
        out = {"bench": "ps", "batch": batch, "dim": dim, "rows": rows, "optimizer": optimizer, **fixed, **raw,
               "cpu_over_zmq_rounds": ratios}
        if dyn_shard is not None:
            d.pop("sent_per_step"), d.pop("received_per_step"), d.pop("exchanges")
            out.update({f"dynamic_{k}": v for k, v in d.items()})  # the last round's
            out["dynamic_fractions"] = fractions
            out["dynamic_fraction"] = float(np.median(fractions))
    out["ps_fraction"] = out["bytes_per_s"] / out["zmq_bytes_per_s"]
    # A step and a round trip move the same bytes, so ps_fraction is the round trip's time over
    # the step's. A step takes at least the CPU both processes spent on it shared out over the
    # cores this process may use: that bounds ps_fraction here, whatever overlaps.
    out["cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out["cpu_ms_per_step"] = out["client_cpu_ms_per_step"] + out["shard_cpu_ms_per_step"]
    out["zmq_cpu_ms_per_round_trip"] = out["zmq_client_cpu_ms_per_round_trip"] + out["zmq_echo_cpu_ms_per_round_trip"]
    out["cpu_bound_ps_fraction"] = out["zmq_ms_per_round_trip"] * out["cores"] / out["cpu_ms_per_step"]
    out["cpu_over_zmq"] = out["cpu_ms_per_step"] / out["zmq_cpu_ms_per_round_trip"]
    out["cpu_over_zmq_pull_push"] = out["cpu_ms_per_step"] / out["zmq_pull_push_cpu_ms_per_step"]
    if curve:
        secure = raw_zmq(**sizes, seconds=seconds, curve=True)
        out["zmq_curve_bytes_per_s"] = secure["zmq_bytes_per_s"]
        out["curve_fraction"] = secure["zmq_bytes_per_s"] / out["zmq_bytes_per_s"]
    return out


def _cpu_over_zmq(fixed: dict, raw: dict) -> float:
    """A round's step CPU (both processes) over raw ZeroMQ's round trip CPU (both processes)."""
    return ((fixed["client_cpu_ms_per_step"] + fixed["shard_cpu_ms_per_step"])
            / (raw["zmq_client_cpu_ms_per_round_trip"] + raw["zmq_echo_cpu_ms_per_round_trip"]))


class _Shard:
    """A shard process holding ``table``, every row of it pushed once (``ids``: the keys of rows
    ``0 .. rows - 1``), and a client of it; :meth:`measure` times steps on it."""

    def __init__(self, table: TableConfig, rows: int, ids=lambda k: k):
        self.table, self.rows, self.ids = table, rows, ids

    def __enter__(self) -> "_Shard":
        self.server = ServerProcess(ShardConfig((self.table,))).__enter__()
        try:
            self.client = PSClient.connect([self.server.address])
        except BaseException:
            self.server.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.client.close()
        finally:
            self.server.__exit__(*exc)

    def measure(self, batches: list, seconds: float) -> dict:
        """Steps of one pull and one push of a batch of ``batches``, for ``seconds``; every row
        is pushed once before the first."""
        client, batch, dim, rows = self.client, len(batches[0]), self.table.dim, self.rows
        grads = torch.full((batch, dim), 1e-3)
        counts = torch.ones(batch, dtype=torch.int64)
        if not getattr(self, "filled", False):  # every row stored before the clock starts
            for lo in range(0, rows, batch):
                keys = self.ids(torch.arange(lo, min(rows, lo + batch)))
                client.wait(client.push("bench", keys, grads[:len(keys)], counts[:len(keys)]))
            self.filled = True
        exchanges = []  # a pull's bytes each way, then a push's
        for send in (lambda: client.pull("bench", batches[0]), lambda: client.push("bench", batches[0], grads, counts)):
            sent0, recv0 = client.bytes["sent"], client.bytes["received"]
            client.wait(send())
            exchanges.append((client.bytes["sent"] - sent0, client.bytes["received"] - recv0))
        before = client.stats()[0]
        busy0, shard_cpu0, shard_main0 = before.get("busy_s", 0.0), before["process_cpu_s"], before["thread_cpu_s"]
        steps, waited_pull, waited_push = 0, 0.0, 0.0
        t0, cpu0, main0 = time.perf_counter(), time.process_time(), time.thread_time()
        sent0, recv0 = client.bytes["sent"], client.bytes["received"]
        pull = client.pull("bench", batches[0])
        while time.perf_counter() - t0 < seconds or steps < 3:
            keys = batches[steps % len(batches)]
            w0 = time.perf_counter()
            client.wait(pull)
            w1 = time.perf_counter()
            push = client.push("bench", keys, grads, counts)
            # the next pull is in flight while this push is applied, as in training
            pull = client.pull("bench", batches[(steps + 1) % len(batches)])
            w2 = time.perf_counter()
            client.wait(push)
            waited_pull, waited_push = waited_pull + w1 - w0, waited_push + time.perf_counter() - w2
            steps += 1
        client.wait(pull)
        elapsed, cpu, main = time.perf_counter() - t0, time.process_time() - cpu0, time.thread_time() - main0
        sent, received = client.bytes["sent"] - sent0, client.bytes["received"] - recv0
        shard = client.stats()[0]
        ms = 1e3 / steps  # where a step goes: the client's CPU (all its threads), the shard's handling, the waits
        return {"steps": steps, "rows_per_s": 2 * batch * steps / elapsed, "bytes_per_s": (sent + received) / elapsed,
                "sent_per_step": round(sent / steps), "received_per_step": round(received / steps), "exchanges": exchanges,
                "shard_bytes": shard["tables"]["bench"]["bytes"], "ms_per_step": elapsed * ms,
                "client_cpu_ms_per_step": cpu * ms, "shard_busy_ms_per_step": (shard.get("busy_s", 0.0) - busy0) * ms,
                "shard_cpu_ms_per_step": (shard["process_cpu_s"] - shard_cpu0) * ms,
                "client_main_cpu_ms_per_step": main * ms,
                "shard_main_cpu_ms_per_step": (shard["thread_cpu_s"] - shard_main0) * ms,
                "wait_pull_ms_per_step": waited_pull * ms, "wait_push_ms_per_step": waited_push * ms}


def add_parser(bsub) -> None:
    """Register ``het bench ps`` on the subparsers of ``het bench``."""
    q = bsub.add_parser("ps", help="pull + push rows/s through one shard over TCP loopback vs raw ZeroMQ")
    q.add_argument("--batch", type=int, default=4096)
    q.add_argument("--dim", type=int, default=128)
    q.add_argument("--rows", type=int, default=200_000)
    q.add_argument("--seconds", type=float, default=5.0)
    q.add_argument("--threads", type=int, default=1)
    q.add_argument("--curve", action="store_true", help="also raw ZeroMQ under CURVE encryption (its cost)")
    q.add_argument("--dynamic", action="store_true", help="also a dynamic table on the same ids as raw int64 keys")
    q.add_argument("--rounds", type=int, default=3, help="rounds of the PS and raw ZeroMQ (and --dynamic's table) in turn")
    q.add_argument("--optimizer", default="sgd", choices=("sgd", "adagrad", "adam"), help="the tables' optimizer")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_main)


def _main(args) -> None:
    import json

    torch.set_num_threads(args.threads)
    result = run(batch=args.batch, dim=args.dim, rows=args.rows, seconds=args.seconds, curve=args.curve,
                 dynamic=args.dynamic, optimizer=args.optimizer,
                 rounds=args.rounds)
    if args.json:
        print(json.dumps(result, sort_keys=True, default=str))
    else:
        print(f"{result['rows_per_s']:,.0f} rows/s, {result['bytes_per_s'] / 1e6:,.0f} MB/s through the PS; "
              f"raw ZeroMQ {result['zmq_bytes_per_s'] / 1e6:,.0f} MB/s ({result['ps_fraction']:.0%})"
              + (f"; under CURVE {result['zmq_curve_bytes_per_s'] / 1e6:,.0f} MB/s ({result['curve_fraction']:.0%} "
                 f"of plain)" if args.curve else "")
              + (f"; dynamic table {result['dynamic_rows_per_s']:,.0f} rows/s ({result['dynamic_fraction']:.0%} of "
                 f"fixed)" if args.dynamic else ""))
