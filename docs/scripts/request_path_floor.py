"""The least CPU any PS request path can spend on ``het bench ps``'s step on this machine: the
same ZeroMQ sockets and bytes as the bench's raw run, and a shard that does only the work no
implementation can skip, with het's own table and native kernels: a pull gathers its 4,096 rows
of dim 128 and their clocks out of a table of 200,000; a push checks its gradients are finite
and applies them (SGD, clocks counted). No header, no checks of the request, no Python between
frame and table beyond the calls themselves; the client's requests prebuilt, unless
``--checks``: then it checks each as any client must before sending it (keys' range, gradients
finite, keys and counts narrowed); ``--het-layout``: requests built each time in het's frames
(int32 keys, uint8 counts, an array a frame), pulls answered as het's lazy replies (a header's
bytes, the rows, their clocks narrowed, the built marks). Printed: CPU milliseconds a step (both processes, every
thread) for that floor and for the raw echo of the same bytes, measured in turn, and their
ratio, the median of the rounds; and the part of the threads making and answering requests.
With ``--het``, each round also runs ``het bench ps``'s step (``het.bench.ps.run``, one round) and its
raw ZeroMQ round trip of a step's bytes in one request and one reply, the line ``cpu_over_zmq`` is
held to: the floor and het over that round trip, and het over the floor, each round's in turn:

    .venv/bin/python docs/scripts/request_path_floor.py [--rounds 5 --seconds 3 --checks --het-layout --het]
"""

import argparse
import json
import multiprocessing as mp
import statistics
import time

import numpy as np
import torch
import zmq

from het import native
from het.config import OptimizerConfig, TableConfig
from het.ps.server.store.fixed import FixedRows

ROWS, BATCH, DIM = 200_000, 4096, 128
PULL = (BATCH * 8, BATCH * DIM * 4 + BATCH * 8)  # keys out; rows and clocks back
PUSH = (BATCH * 8 + BATCH * DIM * 4 + BATCH * 4, 64)  # keys, gradients, counts out; an ack back
HEADER = bytes(220)  # the size of het's header and meta for these requests' replies


def _shard(address_queue, work: bool, het_layout: bool = False) -> None:
    """A ROUTER answering pulls (tag 0) and pushes (tag 1); with ``work`` it gathers and applies,
    without it echoes bytes of the reply's size (the raw run); ``het_layout``: requests and
    replies in het's frames (a header of het's size, not read)."""
    torch.set_num_threads(1)
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    address_queue.put(f"tcp://127.0.0.1:{port}")
    table = FixedRows(TableConfig("t", rows=ROWS, dim=DIM, optimizer=OptimizerConfig("sgd", lr=0.01)), 0, 1)
    rows, ack = np.zeros(PULL[1], dtype=np.uint8), np.zeros(PUSH[1], dtype=np.uint8)
    cpu0, main0 = time.process_time(), time.thread_time()
    while True:
        peer, *frames = sock.recv_multipart(copy=False)
        tag = bytes(frames[0])
        if tag == b"start":
            cpu0, main0 = time.process_time(), time.thread_time()
            sock.send_multipart([peer, b"go"])
            continue
        if tag == b"stop":
            sock.send_multipart([peer, f"{time.process_time() - cpu0} {time.thread_time() - main0}".encode()])
            break
        if het_layout and work:  # het's frames: keys int32, gradients, counts uint8, an array a frame
            keys = torch.from_numpy(np.frombuffer(frames[1].buffer, np.int32)).long()
            if tag == b"0":  # het's lazy reply: a header, the rows, their clocks narrowed, the built marks
                arrays, _ = table.pull_reply(keys, True)
                sock.send_multipart([peer, HEADER, *arrays], copy=False)
            else:
                grads = torch.from_numpy(np.frombuffer(frames[2].buffer, np.float32)).view(BATCH, DIM)
                counts = torch.from_numpy(np.frombuffer(frames[3].buffer, np.uint8)).long()
                if not native.ops.all_finite(grads):
                    raise ValueError("a gradient is not finite")
                table.push(keys, grads, counts, 1)
                sock.send_multipart([peer, HEADER], copy=False)
            continue
        body = frames[1].buffer
        if tag == b"0":
            if work:
                keys = torch.frombuffer(body, dtype=torch.int64)
                sent, _ = table.rows_to_send(keys, lazy=False)
                sock.send_multipart([peer, sent[0], table.clocks_of(keys).numpy()], copy=False)
            else:
                sock.send_multipart([peer, rows], copy=False)
        else:
            if work:
                raw = torch.frombuffer(body, dtype=torch.uint8)
                keys = raw[:BATCH * 8].view(torch.int64)
                grads = raw[BATCH * 8:BATCH * 8 + BATCH * DIM * 4].view(torch.float32).view(BATCH, DIM)
                counts = raw[BATCH * 8 + BATCH * DIM * 4:].view(torch.int32).to(torch.int64)
                if not native.ops.all_finite(grads):
                    raise ValueError("a gradient is not finite")
                table.push(keys, grads, counts, 1)
            sock.send_multipart([peer, ack], copy=False)
    sock.close(linger=1000)


def _checks(keys: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor, push: bool) -> None:
    """What a client must do to a request before sending it, whatever its protocol: its keys
    range-checked and narrowed; a push's gradients checked finite and its counts narrowed."""
    lo, hi = (int(k) for k in torch.aminmax(keys))
    if lo < 0 or hi >= ROWS:
        raise ValueError("a key out of range")
    keys.to(torch.int32)
    if push:
        if not native.ops.all_finite(grads):
            raise ValueError("a gradient is not finite")
        lo, hi = (int(c) for c in torch.aminmax(counts))
        counts.to(torch.uint8)


def _round(work: bool, seconds: float, checks: bool = False, het_layout: bool = False) -> tuple:
    """CPU ms a step (a pull and a push, two requests in flight) of both processes, and of their
    threads making and answering requests (ZeroMQ's I/O threads left out): together, the client's,
    the shard's; with ``checks``, the client checks each request as it sends it (:func:`_checks`);
    with ``het_layout``, requests and replies travel in het's frames (:func:`_shard`)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_shard, args=(q, work, het_layout), daemon=True)
    proc.start()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.rcvtimeo = 30_000  # a shard that died raises here, not hangs
    try:
        sock.connect(q.get(timeout=60))
        rng = np.random.default_rng(0)
        batches = [rng.choice(ROWS, BATCH, replace=False).astype(np.int64) for _ in range(64)]  # as the bench's
        grads = np.full((BATCH, DIM), 1e-3, dtype=np.float32).tobytes()
        counts = np.ones(BATCH, dtype=np.int32).tobytes()
        requests = [([b"0", k.tobytes()], [b"1", k.tobytes() + grads + counts]) for k in batches]
        requests = [r for pair in requests for r in pair]
        key_tensors = [torch.from_numpy(k) for k in batches]
        grad_tensor, count_tensor = torch.full((BATCH, DIM), 1e-3), torch.ones(BATCH, dtype=torch.int64)
        sock.send(b"start")
        sock.recv()
        sent = replies = 0
        t0, cpu0, main0 = time.perf_counter(), time.process_time(), time.thread_time()
        sock.send_multipart(requests[0], copy=False)
        sent = 1
        while time.perf_counter() - t0 < seconds or replies % 2:
            if checks:
                _checks(key_tensors[(sent // 2) % len(key_tensors)], grad_tensor, count_tensor, bool(sent % 2))
            if het_layout:  # built from the tensors each time, as a client builds them
                keys = key_tensors[(sent // 2) % len(key_tensors)].to(torch.int32).numpy()
                sock.send_multipart([b"1", keys, grad_tensor.numpy(), count_tensor.to(torch.uint8).numpy()] if sent % 2
                                    else [b"0", keys], copy=False)
            else:
                sock.send_multipart(requests[sent % len(requests)], copy=False)
            sent += 1
            sock.recv_multipart(copy=False)
            replies += 1
        sock.recv_multipart(copy=False)
        cpu, main = time.process_time() - cpu0, time.thread_time() - main0
        sock.send(b"stop")
        shard_cpu, shard_main = map(float, sock.recv().split())
    finally:
        sock.close(linger=0)
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    ms = 1e3 / (replies // 2)
    return (cpu + shard_cpu) * ms, (main + shard_main) * ms, main * ms, shard_main * ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--checks", action="store_true",
                        help="the floor's client checks each request as any client must (the raw run's does not)")
    parser.add_argument("--het-layout", action="store_true",
                        help="requests built each time in het's frames, pulls answered as het's lazy replies")
    parser.add_argument("--het", action="store_true",
                        help="each round also het bench ps's step and raw round trip (het.bench.ps.run, one round)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    floor, raw, het = [], [], []
    for _ in range(args.rounds):
        floor.append(_round(True, args.seconds, args.checks, args.het_layout))
        raw.append(_round(False, args.seconds))
        if args.het:
            from het.bench import ps

            out = ps.run(seconds=args.seconds, rounds=1)
            het.append((out["cpu_ms_per_step"], out["zmq_cpu_ms_per_round_trip"], out["client_main_cpu_ms_per_step"],
                        out["shard_main_cpu_ms_per_step"]))
    median = lambda runs, i: round(statistics.median(r[i] for r in runs), 3)  # noqa: E731
    ratios = [f[0] / r[0] for f, r in zip(floor, raw)]
    report = {"floor_cpu_ms_per_step": median(floor, 0), "raw_cpu_ms_per_step": median(raw, 0),
              "floor_over_raw": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
              "floor_main_cpu_ms_per_step": median(floor, 1), "raw_main_cpu_ms_per_step": median(raw, 1),
              "floor_client_main_cpu_ms_per_step": median(floor, 2),
              "floor_shard_main_cpu_ms_per_step": median(floor, 3)}
    if het:  # over the round trip of a step's bytes, as het bench ps's cpu_over_zmq
        rounds = {"floor_over_round_trip": [f[0] / h[1] for f, h in zip(floor, het)],
                  "het_over_round_trip": [h[0] / h[1] for h in het],
                  "het_over_floor": [h[0] / f[0] for f, h in zip(floor, het)]}
        report["het_cpu_ms_per_step"] = median(het, 0)
        report["round_trip_cpu_ms"] = median(het, 1)
        report["het_client_main_cpu_ms_per_step"] = median(het, 2)
        report["het_shard_main_cpu_ms_per_step"] = median(het, 3)
        for name, values in rounds.items():
            report[name] = round(statistics.median(values), 3)
            report[name + "_rounds"] = [round(v, 3) for v in values]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
