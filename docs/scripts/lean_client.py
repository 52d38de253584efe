"""What het's client layers cost on ``het bench ps``'s step, against the leanest Python client of
the same shard: the same requests (a pull of 4,096 keys as int32, a push of their float32
gradients and uint8 counts), the same checks of what it sends (keys' range and width, gradients
finite, counts narrowed) and of what it reads (header, meta, rows, clocks widened, marks
counted), written straight onto the shard's socket: no handles, routing, sessions bookkeeping,
generic encode, decode or merge. The two take turns on one shard process, and raw ZeroMQ of the
step's bytes (``het bench ps``'s round trip) after them in each round; printed: CPU milliseconds a
step of each side (every thread, and the thread making or answering requests), and each
client's step over raw ZeroMQ's round trip (``over_zmq``, as ``het bench ps``'s ``cpu_over_zmq``),
the medians of the rounds:

    .venv/bin/python docs/scripts/lean_client.py [--rounds 5 --seconds 3]
"""

import argparse
import json
import statistics
import time

import numpy as np
import torch

from het import native
from het.bench.ps import _Shard, raw_zmq
from het.config import OptimizerConfig, TableConfig
from het.ps.protocol.messages import HEADER, MAGIC, VERSION, Op

ROWS, BATCH, DIM = 200_000, 4096, 128


def _lean(shard: _Shard, batches: list, grads: torch.Tensor, counts: torch.Tensor, seconds: float) -> dict:
    """Steps through the bench client's own socket, session and nonce, for ``seconds``."""
    link = shard.client.link
    sock, session, nonce, seq = link.channels[0].socket, link.session, link.nonces[0], [1 << 40]

    def send(op: int, fields: str, arrays: list) -> None:
        seq[0] += 1
        specs = ",".join(f'["{code}",[{",".join(map(str, a.shape))}]]' for code, a in arrays)
        meta = f'{{{fields}"session":"{session}","seq":{seq[0]},"nonce":"{nonce}","arrays":[{specs}]}}'.encode()
        sock.send_multipart([HEADER.pack(MAGIC, VERSION, op, 0, 0, seq[0], len(meta)) + meta,
                             *(a for _, a in arrays)], copy=False)

    def wire(keys: torch.Tensor) -> np.ndarray:
        lo, hi = (int(k) for k in torch.aminmax(keys))
        assert 0 <= lo and hi < ROWS
        return keys.to(torch.int32).numpy()

    def reply(rows: bool) -> None:
        frames = sock.recv_multipart(copy=False)
        head = frames[0].buffer
        assert HEADER.unpack_from(head)[0] == MAGIC and "error" not in json.loads(bytes(head[HEADER.size:]))
        if rows:
            torch.from_numpy(np.frombuffer(frames[1].buffer, np.float32).reshape(-1, DIM))
            torch.from_numpy(np.frombuffer(frames[2].buffer, np.uint8)).long()
            int(np.unpackbits(np.frombuffer(frames[3].buffer, np.uint8)).sum())

    def push(keys: torch.Tensor) -> None:
        assert native.ops.all_finite(grads)
        lo, hi = (int(c) for c in torch.aminmax(counts))
        assert 0 <= lo and hi < 256
        send(Op.PUSH, '"table":"bench","step":1,', [("i4", wire(keys)), ("f4", grads.numpy()),
                                                    ("u1", counts.to(torch.uint8).numpy())])

    before = shard.client.stats()[0]
    steps, t0, cpu0, main0 = 0, time.perf_counter(), time.process_time(), time.thread_time()
    send(Op.PULL, '"table":"bench","lazy":true,', [("i4", wire(batches[0]))])
    while time.perf_counter() - t0 < seconds or steps < 3:
        reply(rows=True)
        push(batches[steps % len(batches)])
        send(Op.PULL, '"table":"bench","lazy":true,', [("i4", wire(batches[(steps + 1) % len(batches)]))])
        reply(rows=False)
        steps += 1
    reply(rows=True)
    cpu, main = time.process_time() - cpu0, time.thread_time() - main0
    after = shard.client.stats()[0]
    ms = 1e3 / steps
    return {"client_cpu_ms_per_step": cpu * ms, "client_main_cpu_ms_per_step": main * ms,
            "shard_cpu_ms_per_step": (after["process_cpu_s"] - before["process_cpu_s"]) * ms,
            "shard_main_cpu_ms_per_step": (after["thread_cpu_s"] - before["thread_cpu_s"]) * ms}


def setup(description: str) -> tuple:
    """The command line (``--rounds``, ``--seconds``) and the bench's step: its 64 batches of
    random rows, gradients and counts, one torch thread."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = torch.Generator().manual_seed(0)
    batches = [torch.randperm(ROWS, generator=rng)[:BATCH] for _ in range(64)]
    return args, batches, torch.full((BATCH, DIM), 1e-3), torch.ones(BATCH, dtype=torch.int64)


def main() -> None:
    args, batches, grads, counts = setup(__doc__.split("\n\n")[0])
    table = TableConfig("bench", rows=ROWS, dim=DIM, optimizer=OptimizerConfig("sgd", lr=0.01))
    runs = {"het": [], "lean": []}
    with _Shard(table, ROWS) as shard:
        shard.measure(batches, 1.0)  # every row stored, the session known to the shard
        for _ in range(args.rounds):
            het = shard.measure(batches, args.seconds)
            lean = _lean(shard, batches, grads, counts, args.seconds)
            raw = raw_zmq(het["sent_per_step"], het["received_per_step"], args.seconds)
            raw_cpu = raw["zmq_client_cpu_ms_per_round_trip"] + raw["zmq_echo_cpu_ms_per_round_trip"]
            for side, r in (("het", het), ("lean", lean)):
                r["over_zmq"] = (r["client_cpu_ms_per_step"] + r["shard_cpu_ms_per_step"]) / raw_cpu
                runs[side].append(r)
    keys = list(runs["lean"][0])
    print(json.dumps({side: {k: round(statistics.median(r[k] for r in rs), 3) for k in keys} for side, rs in runs.items()}))


if __name__ == "__main__":
    main()
