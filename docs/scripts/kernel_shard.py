"""What het's client reaches on ``het bench ps``'s step against a shard whose hot requests cost
nothing but their kernels: the bound of moving the shard's request path into native code. The
shard process holds a real :class:`het.ps.server.shard.Shard` (it answers INFO, STATS and the rows'
first, delta-coded pushes, and holds the rows), but reads a PULL or PUSH by its header alone,
trusting the bench's layout (int32 keys, float32 gradients, uint8 counts) and checking nothing
but the gradients' finiteness, calls the table's kernels (the lazy pull's one-pass gather, the
SGD push) and writes het's reply. It takes turns with the real shard, each followed by raw
ZeroMQ of the same bytes; printed, the medians of the rounds: each shard's step CPU over raw
ZeroMQ's round trip (``cpu_over_zmq``, as ``het bench ps``'s) and the request threads' CPU a
step; and the same for the leanest Python client (``lean_client.py``'s) against it
(``lean_kernels``): both sides' Python gone. Not a shard anyone should run: nothing is checked.

    .venv/bin/python docs/scripts/kernel_shard.py [--rounds 5 --seconds 3]
"""

import json
import multiprocessing as mp
import statistics

import numpy as np
import torch
import zmq

from lean_client import _lean, setup  # a sibling script: run as docs/scripts/kernel_shard.py

from het import native
from het.bench.ps import _Shard, raw_zmq
from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.client.client import PSClient
from het.ps.protocol.messages import HEADER, Op
from het.ps.protocol.transport import ZmqEndpoint
from het.ps.server.hot import encode_reply
from het.ps.server.shard import Shard

ROWS, BATCH, DIM = 200_000, 4096, 128
TABLE = TableConfig("bench", rows=ROWS, dim=DIM, optimizer=OptimizerConfig("sgd", lr=0.01))


def _serve(address_queue) -> None:
    torch.set_num_threads(1)
    shard = Shard(ShardConfig((TABLE,)))
    table = shard.tables["bench"]
    endpoint = ZmqEndpoint(zmq.Context.instance(), "127.0.0.1:0")
    address_queue.put(endpoint.address)
    while not shard.stopping:
        peer, frames = endpoint.recv(None)
        head = frames[0].buffer
        op, rid = head[5], HEADER.unpack_from(head)[5]
        if b'"deltas"' in bytes(head):  # ascending keys (the rows stored first): the shard's own path
            op = None
        if op == Op.PULL:
            keys = torch.from_numpy(np.frombuffer(frames[1].buffer, np.int32)).long()
            arrays, _ = table.pull_reply(table.locate(keys), True)
            reply = encode_reply(Op.PULL, rid, {}, arrays)
        elif op == Op.PUSH:
            keys = torch.from_numpy(np.frombuffer(frames[1].buffer, np.int32)).long()
            grads = torch.from_numpy(np.frombuffer(frames[2].buffer, np.float32)).view(len(keys), DIM)
            if not native.ops.all_finite(grads):
                raise ValueError("a gradient is not finite")
            counts = torch.from_numpy(np.frombuffer(frames[3].buffer, np.uint8)).long()
            table.push(table.locate(keys), grads, counts, 1)
            reply = encode_reply(Op.PUSH, rid, {"applied": len(keys)}, [])
        else:
            reply = shard.handle_frames(frames)
        endpoint.send(peer, reply)
    endpoint.close()


class _KernelShard(_Shard):
    """:class:`het.bench.ps._Shard` of the process above."""

    def __enter__(self):
        q = mp.get_context("spawn").Queue()
        self.proc = mp.get_context("spawn").Process(target=_serve, args=(q,), daemon=True)
        self.proc.start()
        self.client = PSClient.connect([q.get(timeout=60)])
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.client.stop_servers()
            self.client.close()
        finally:
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()


def main() -> None:
    args, batches, grads, counts = setup(__doc__.split("\n\n")[0])
    runs = {"het": [], "kernels": [], "lean_kernels": []}
    with _Shard(TABLE, ROWS) as real, _KernelShard(TABLE, ROWS) as bare:
        for shard in (real, bare):
            shard.measure(batches, 1.0)  # every row stored, the session known to the shard
        for _ in range(args.rounds):
            sizes = None
            for side, shard in (("het", real), ("kernels", bare), ("lean_kernels", bare)):
                if side == "lean_kernels":
                    r = _lean(shard, batches, grads, counts, args.seconds)
                else:
                    r = shard.measure(batches, args.seconds)
                    sizes = r["sent_per_step"], r["received_per_step"]
                raw = raw_zmq(*sizes, args.seconds)
                raw_cpu = raw["zmq_client_cpu_ms_per_round_trip"] + raw["zmq_echo_cpu_ms_per_round_trip"]
                runs[side].append({"cpu_over_zmq": (r["client_cpu_ms_per_step"] + r["shard_cpu_ms_per_step"]) / raw_cpu,
                                   "client_main_cpu_ms_per_step": r["client_main_cpu_ms_per_step"],
                                   "shard_main_cpu_ms_per_step": r["shard_main_cpu_ms_per_step"]})
    print(json.dumps({side: {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]}
                      | {"rounds": [round(r["cpu_over_zmq"], 3) for r in rs]} for side, rs in runs.items()}))


if __name__ == "__main__":
    main()
