"""The CPU of ``het bench ps``'s step without ZeroMQ: a pull of 4,096 rows of dim 128 and a push
of their gradients (SGD, 200,000 rows all stored, 64 batches of random rows in turn), in one
thread. The client's side: its requests built and its replies merged, the shard's replies made
beforehand (``--general``: by its general path only; ``--shards``: the table over several shards,
every request split among them; ``--sorted``: each batch's keys ascending, sent delta-coded); the
shard's side: ``Shard.handle_frames`` of the client's requests, the native kernels' share (the
reply's gather, the push, the NaN checks) timed apart. Milliseconds a step, the median of five runs:

    .venv/bin/python docs/scripts/request_path_cpu.py [--steps 1500 --shards 1 --general --sorted]
"""

import argparse
import json
import struct
import time

import torch

from het import native
from het.config import OptimizerConfig, ShardConfig, TableConfig
from het.ps.client.client import PSClient
from het.ps.server.shard import Shard

ROWS, BATCH, DIM = 200_000, 4096, 128
KERNELS = ("pull_touched", "table_push", "all_finite")
_ID = struct.Struct("<Q")  # a header's request id, at byte 8


class _Channel:
    """A client's channel to ``shard`` in this thread. ``replay``: answer each op with the reply
    it got last for a request of as many keys (under the new request's id), the shard untouched;
    ``hold``: keep the requests unanswered, for the shard to take later."""

    def __init__(self, shard: Shard):
        self.shard, self.address, self.replies, self.last, self.held = shard, "in-process", [], {}, []
        self.replay = self.hold = False

    def send(self, frames) -> None:
        if self.hold:
            self.held.append(list(frames))
            return
        op, rid = frames[0][5], _ID.unpack_from(frames[0], 8)[0]  # the header's op and request id, unparsed
        asked = (op, memoryview(frames[1]).nbytes if len(frames) > 1 else 0)  # the op and its keys' bytes
        if self.replay and asked in self.last:  # the reply of last time, its header given this request's id
            head, *arrays = self.last[asked]
            self.replies.append([head[:8] + _ID.pack(rid) + head[16:], *arrays])
            return
        out = self.shard.handle_frames(frames)
        self.last[asked] = [bytes(memoryview(out[0])), *out[1:]]
        self.replies.append(out)

    def recv(self, timeout_s):
        return self.replies.pop(0)

    def close(self) -> None:
        pass


def _steps(client: PSClient, batches: list, grads, counts, n: int) -> None:
    pull = client.pull("t", batches[0])
    for i in range(n):
        client.wait(pull)
        push = client.push("t", batches[i % len(batches)], grads, counts)
        pull = client.pull("t", batches[(i + 1) % len(batches)])
        client.wait(push)
    client.wait(pull)


def _requests(client: PSClient, batches: list, grads, counts, n: int) -> None:
    """The requests of ``n`` steps, sent and never waited for."""
    for i in range(n):
        client.pull("t", batches[i % len(batches)])
        client.push("t", batches[i % len(batches)], grads, counts)


def _timed_kernels(spent: dict) -> None:
    """Wrap the native kernels a step calls so that their thread CPU adds up in ``spent``."""
    for name in KERNELS:
        op = getattr(native.ops, name)

        def timed(*args, _op=op, _name=name):
            start = time.thread_time()
            try:
                return _op(*args)
            finally:
                spent[_name] += time.thread_time() - start

        setattr(native.ops, name, timed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--shards", type=int, default=1, help="shards the table is split over (the client's requests to each)")
    p.add_argument("--general", action="store_true", help="the client's general path only, not its short path")
    p.add_argument("--sorted", action="store_true",
                   help="each batch's keys in ascending order (a dense table's, a flush's): sent delta-coded")
    args = p.parse_args()
    if native.ops is None:
        raise SystemExit("the native core is not built: run `make native`")
    torch.set_num_threads(1)
    table = TableConfig("t", rows=ROWS, dim=DIM, optimizer=OptimizerConfig("sgd", lr=0.01))
    channels = [_Channel(Shard(ShardConfig((table,), i, args.shards))) for i in range(args.shards)]
    client = PSClient(channels)
    if args.general:
        client._hot = None
    rng = torch.Generator().manual_seed(0)
    batches = [torch.randperm(ROWS, generator=rng)[:BATCH] for _ in range(64)]
    if args.sorted:
        batches = [b.sort().values for b in batches]
    grads, counts = torch.full((BATCH, DIM), 1e-3), torch.ones(BATCH, dtype=torch.int64)
    for lo in range(0, ROWS, BATCH):  # every row stored
        keys = torch.arange(lo, min(ROWS, lo + BATCH))
        client.wait(client.push("t", keys, grads[:len(keys)], counts[:len(keys)]))
    spent = dict.fromkeys(KERNELS, 0.0)
    _timed_kernels(spent)
    runs = []
    for _ in range(5):
        for channel in channels:
            channel.replay = True  # the client alone
        start = time.thread_time()
        _steps(client, batches, grads, counts, args.steps)
        client_ms = (time.thread_time() - start) * 1e3 / args.steps
        for channel in channels:
            channel.replay, channel.hold = False, True  # the requests, for the shards alone
        _requests(client, batches, grads, counts, args.steps)
        held = [(channel.shard, frames) for channel in channels for frames in channel.held]
        for channel in channels:
            channel.hold = False
            channel.held.clear()
        for k in spent:
            spent[k] = 0.0
        start = time.thread_time()
        for shard, frames in held:
            shard.handle_frames(frames)
        shard_ms = (time.thread_time() - start) * 1e3 / args.steps
        runs.append({"client_ms": client_ms, "shard_ms": shard_ms,
                     **{f"shard_{k}_ms": v * 1e3 / args.steps for k, v in spent.items()}})
    median = {k: sorted(r[k] for r in runs)[2] for k in runs[0]}
    median["shard_python_ms"] = median["shard_ms"] - sum(median[f"shard_{k}_ms"] for k in KERNELS)
    print(json.dumps({k: round(v, 4) for k, v in median.items()}))


if __name__ == "__main__":
    main()
