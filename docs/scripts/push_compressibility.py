"""How far the gradients het pushes would compress without loss: a probe for the next step on
the sparse bytes (a target of 88% fewer).

    .venv/bin/python docs/scripts/push_compressibility.py

One rank of the e2e job (the default job at batch 128) trains 300 steps against in-process
shards; every gradient it pushes (evicted rows, bypassed keys, rows due, the idle rows and the
final flush) is kept. Prints one JSON object: zlib's ratio and speed on the float32 bytes as
they are and byte-shuffled (the four bytes of every float in four planes, as blosc does), and
each plane's ratio alone. zlib stands for a general codec; a fast one (LZ4, zstd) would trade
some ratio for speed.
"""

from __future__ import annotations

import json
import time
import zlib

import numpy as np
import torch

from het.ps.local import local_client
from het.train.config import TrainConfig
from het.train.loop import Worker
from het.train.tasks import job_tables


def pushed_gradients(steps: int = 300) -> np.ndarray:
    cfg = TrainConfig.load(None, {"batch": 128, "steps": steps}, {})
    client = local_client(job_tables(cfg), cfg.servers, lazy_init=cfg.lazy_init)
    worker = Worker(cfg, client)
    kept = []

    def keeping(send):
        def wrapped(table, keys, grads, *args, **kwargs):
            if len(grads):
                kept.append(grads.detach().float().numpy().reshape(-1).copy())
            return send(table, keys, grads, *args, **kwargs)
        return wrapped

    client.push_sync, client.push = keeping(client.push_sync), keeping(client.push)
    worker.train(steps, 0, progress=False)
    return np.concatenate(kept)


def ratio(data: bytes, level: int) -> tuple[float, float]:
    start = time.perf_counter()
    packed = zlib.compress(data, level)
    return len(data) / len(packed), len(data) / (time.perf_counter() - start) / 1e6


def main() -> None:
    torch.set_num_threads(1)
    grads = pushed_gradients()
    planes = grads.view(np.uint8).reshape(-1, 4).T.copy()  # little-endian: plane 3 holds sign and exponent
    out = {"floats": int(grads.size), "zeros": float((grads == 0).mean())}
    for name, data in (("raw", grads.tobytes()), ("shuffled", planes.tobytes())):
        for level in (1, 6):
            r, speed = ratio(data, level)
            out[f"{name}_zlib{level}_ratio"], out[f"{name}_zlib{level}_mb_per_s"] = round(r, 3), round(speed)
    out["plane_ratios"] = [round(ratio(p.tobytes(), 6)[0], 3) for p in planes]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
