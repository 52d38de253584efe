"""Slow, exact references the fast code is checked against (tests only)."""

from __future__ import annotations

import heapq
from collections import OrderedDict

import torch

from het.ps.server.store.torch_optim import FTRLTorch, RowWiseAdagradTorch


class ExactLRU:
    """Fully associative LRU with HET's batch semantics: a key is a hit if cached when its batch
    starts; the batch's keys are used at once; victims are never keys of the current batch and
    a miss that finds no victim bypasses the cache."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.order = OrderedDict()  # key -> None, least recent first

    def step(self, keys) -> int:
        keys = list(dict.fromkeys(keys))
        hits = [k for k in keys if k in self.order]
        for k in hits:
            self.order.move_to_end(k)
        in_batch, hit_set = set(keys), set(hits)
        misses = [k for k in keys if k not in hit_set]
        if self.capacity == 0:
            return len(misses)
        for k in misses:
            if len(self.order) >= self.capacity:
                victim = next(iter(self.order))
                if victim in in_batch:  # only current-batch keys remain: bypass
                    continue
                del self.order[victim]
            if self.capacity:
                self.order[k] = None
        return len(misses)


class ExactLFU:
    """Fully associative LFU: the victim has the fewest uses since insertion, ties broken by
    least recent use; same batch semantics as ExactLRU."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.uses, self.last = {}, {}
        self.heap = []  # (uses, last_use, key), stale entries skipped
        self.t = 0

    def _touch(self, k, uses):
        self.uses[k], self.last[k] = uses, self.t
        heapq.heappush(self.heap, (uses, self.t, k))

    def step(self, keys) -> int:
        self.t += 1
        keys = list(dict.fromkeys(keys))
        hits = [k for k in keys if k in self.uses]
        for k in hits:
            self._touch(k, self.uses[k] + 1)
        misses = [k for k in keys if k not in self.uses]
        for k in misses:
            if len(self.uses) >= self.capacity:
                victim = self._pop_victim()
                if victim is None:
                    continue
            if self.capacity:
                self._touch(k, 1)
        return len(misses)

    def _pop_victim(self):
        while self.heap:
            uses, last, k = self.heap[0]
            if self.uses.get(k) != uses or self.last.get(k) != last:
                heapq.heappop(self.heap)  # stale entry
                continue
            if last == self.t:  # the oldest live entry is of this batch: nothing evictable
                return None
            heapq.heappop(self.heap)
            del self.uses[k], self.last[k]
            return k
        return None


def miss_rate(sim, trace, batch: int) -> float:
    lookups = misses = 0
    for i in range(0, len(trace), batch):
        keys = list(dict.fromkeys(trace[i:i + batch].tolist()))
        lookups += len(keys)
        misses += sim.step(keys)
    return misses / lookups


def compare(keys: int = 20_000, batch: int = 512, steps: int = 150) -> list[dict]:
    """Miss rates of het's cache beside the exact policies (``python tests/reference.py``)."""
    import torch

    from het.cache.cache import EmbeddingCache
    from het.config import CacheConfig, TableConfig
    from het.data.zipf import zipf_keys

    rows = []
    for alpha in (0.9, 1.05, 1.2):
        trace = zipf_keys(keys, alpha, batch * steps, seed=int(alpha * 100))
        for frac in (0.05, 0.15, 0.30):
            for policy, exact in (("lru", ExactLRU), ("lfu", ExactLFU)):
                cache = EmbeddingCache(TableConfig("t", rows=keys, dim=4),
                                       CacheConfig(capacity=int(frac * keys), policy=policy))
                for i in range(0, len(trace), batch):
                    cache.lookup(torch.unique(torch.from_numpy(trace[i:i + batch])))
                rows.append({"alpha": alpha, "capacity_frac": frac, "policy": policy,
                             "het": cache.stats()["miss_rate"],
                             "exact": miss_rate(exact(int(frac * keys)), trace, batch)})
    return rows


if __name__ == "__main__":
    print("| alpha | cache | policy | exact miss rate | het miss rate | difference |")
    print("|---|---|---|---|---|---|")
    for r in compare():
        print(f"| {r['alpha']} | {r['capacity_frac']:.0%} | {r['policy']} | {r['exact']:.4f} | {r['het']:.4f} | "
              f"{(r['het'] - r['exact']) * 100:+.2f} pp |")


TORCH_OPTIMIZERS = {
    "sgd": lambda params, lr: torch.optim.SGD(params, lr=lr),
    "adagrad": lambda params, lr: torch.optim.Adagrad(params, lr=lr),
    "adam": lambda params, lr: torch.optim.SparseAdam(params, lr=lr),
    "rowwise_adagrad": lambda params, lr: RowWiseAdagradTorch(params, lr=lr),  # torch has none: ours
    "ftrl": lambda params, lr: FTRLTorch(params, lr=lr),
}


def train_side_by_side(emb, rows: int, optimizer: str, lr: float, steps: int = 50, seed: int = 1, ids=None,
                       round_to: torch.dtype | None = None):
    """The same batches through ``emb`` (a het.Embedding) and nn.Embedding(sparse=True); the max
    abs row gap. ``ids`` (rows,): the key ``emb`` knows row ``i`` of the reference by (raw int64
    ids for a dynamic table); default ``i``. ``round_to``: the reference's rows rounded to that
    dtype (nearest) after every step, as a table stored in it rounds them."""
    ids = torch.arange(rows) if ids is None else ids
    ref = torch.nn.Embedding(rows, emb.tables["embedding"].dim, sparse=True)
    with torch.no_grad():
        ref.weight.copy_(emb.read(ids))
    ref_opt = TORCH_OPTIMIZERS[optimizer](ref.parameters(), lr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        keys = torch.randint(0, rows, (16, 3), generator=g)  # duplicates within a batch on purpose
        target = torch.randn(16, 3, emb.tables["embedding"].dim, generator=g)
        ((emb(ids[keys]) - target) ** 2).mean().backward()
        ref_opt.zero_grad()
        ((ref(keys) - target) ** 2).mean().backward()
        ref_opt.step()
        if round_to is not None:
            with torch.no_grad():
                ref.weight.copy_(ref.weight.to(round_to).float())
    return float((emb.read(ids) - ref.weight.detach()).abs().max())
