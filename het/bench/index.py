"""What a dynamic table's key index costs: DRAM bytes a stored key besides its row, and insert and
lookup keys/s on one core, for the native index and its reference.

``--keys`` random int64 keys go into an index in batches of ``--batch`` (as a push's new keys
arrive), then batches of held keys and of keys never inserted are looked up (as a pull's keys).
A key's bytes are the index's own account (its tables and its slot -> key array), the growth of
the process's resident memory while the keys went in, and beside both the 8 bytes of clock and
last step that :class:`het.ps.server.store.dynamic.DynamicRows` keeps a slot: together, everything a
stored key costs in DRAM besides its row and optimizer state. The reference (sorted runs, whose
insert sorts its recent run again) is measured on ``--reference-keys``, fewer: its bytes a key
do not depend on the count, its speed falls with it.

    het bench index --keys 50000000 --json
"""

from __future__ import annotations

import gc
import json
import sys
import time

import numpy as np
import torch

from het import native
from het.process import release_freed_memory, rss_bytes
from het.ps.server.store.index import KeyIndex, NativeKeyIndex

META_BYTES = 8  # DynamicRows' clock and last step a slot (int32 each)


def measure(make, keys: int, batch: int, seed: int = 0, say=lambda line: None) -> dict:
    """One index: ``keys`` random keys inserted ``batch`` at a time, then looked up."""
    rng = np.random.default_rng(seed)
    all_keys = torch.from_numpy(rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, keys, dtype=np.int64))
    # distinct keys: 2^64 values make a repeat rare, but one would break insert's contract
    all_keys = torch.unique(all_keys)
    all_keys = all_keys[torch.from_numpy(rng.permutation(len(all_keys)))]
    n = len(all_keys)
    gc.collect()
    release_freed_memory()  # what the key generation freed is given back, not reused unseen
    before = rss_bytes()
    index = make()
    inserting = 0.0
    for lo in range(0, n, batch):
        part = all_keys[lo:lo + batch]
        t = time.perf_counter()
        index.insert(part, torch.arange(lo, lo + len(part)))
        inserting += time.perf_counter() - t
        if lo and lo % (batch * 1024) == 0:
            say(f"  {lo:,} keys in, {lo / inserting:,.0f} keys/s")
    gc.collect()
    release_freed_memory()  # as a shard does after an index rebuild or merge
    grown = rss_bytes() - before
    lookups = min(n, 4_000_000)
    held = all_keys[torch.from_numpy(rng.choice(n, lookups, replace=False))]
    absent = torch.from_numpy(rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, lookups, dtype=np.int64))

    def lookup_rate(probe: torch.Tensor) -> tuple[float, torch.Tensor]:
        t, found = time.perf_counter(), []
        for lo in range(0, len(probe), batch):
            found.append(index.lookup(probe[lo:lo + batch]))
        return len(probe) / (time.perf_counter() - t), torch.cat(found)

    hit_rate, slots = lookup_rate(held)
    miss_rate, missing = lookup_rate(absent)
    if not bool((slots >= 0).all()) or not torch.equal(index.keys_of(slots), held):
        raise RuntimeError("the index lost a key it was given")
    absent_held = int((missing >= 0).sum())
    return {"keys": n, "batch": batch, "load": round(index.load, 4),
            "index_bytes_per_key": round(index.nbytes / n, 2),
            "rss_bytes_per_key": round(grown / n, 2),
            "bytes_per_key": round(index.nbytes / n + META_BYTES, 2),
            "rss_plus_meta_bytes_per_key": round(grown / n + META_BYTES, 2),
            "insert_keys_per_s": round(n / inserting), "lookup_hit_keys_per_s": round(hit_rate),
            "lookup_miss_keys_per_s": round(miss_rate), "absent_found": absent_held}


def run(keys: int, batch: int, reference_keys: int, say=lambda line: None) -> dict:
    torch.set_num_threads(1)  # one core: the shard's request thread
    out = {"keys": keys, "batch": batch, "meta_bytes_per_key": META_BYTES, "threads": 1}
    if native.usable():
        say(f"native index, {keys:,} keys")
        out["native"] = measure(NativeKeyIndex, keys, batch, say=say)
        gc.collect()
    say(f"reference index, {reference_keys:,} keys")
    out["reference"] = measure(KeyIndex, reference_keys, batch, say=say)
    return out


def add_parser(bsub) -> None:
    """Register ``het bench index`` on the subparsers of ``het bench``."""
    p = bsub.add_parser("index", help="a dynamic table's key index: DRAM bytes a key, insert and lookup keys/s",
                        description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--keys", type=int, default=10_000_000, help="keys in the native index (default 10,000,000)")
    p.add_argument("--batch", type=int, default=4096, help="keys an insert or lookup call takes (default 4096)")
    p.add_argument("--reference-keys", type=int, default=2_000_000,
                   help="keys in the reference index, at most --keys (default 2,000,000)")
    p.add_argument("--json", action="store_true", help="the last line of stdout is the result as JSON")
    p.set_defaults(func=_main)


def _main(args) -> None:
    if args.keys < 1 or args.batch < 1:
        raise SystemExit(f"het bench index: expected --keys and --batch of at least 1, got {args.keys} and {args.batch}")
    result = run(args.keys, args.batch, min(args.keys, args.reference_keys),
                 say=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return
    for name in ("native", "reference"):
        if name in result:
            r = result[name]
            print(f"{name}: {r['keys']:,} keys, {r['bytes_per_key']} B a key besides the row "
                  f"(index {r['index_bytes_per_key']} + meta {META_BYTES}; resident growth {r['rss_bytes_per_key']}), "
                  f"load {r['load']}, insert {r['insert_keys_per_s']:,} keys/s, lookup {r['lookup_hit_keys_per_s']:,} "
                  f"(held) / {r['lookup_miss_keys_per_s']:,} (absent) keys/s")
