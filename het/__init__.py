"""het: training huge embedding models with sharded parameter servers and worker caches.

How a batch travels::

    keys (B, F) int64 --unique--> cache.lookup --> hits, misses, victims
                                        |                 |
                       (c_s of hits, -1 for misses)   (evicted rows with updates)
                                        v                 v
                              one PUSH_SYNC message per PS shard (key % S)
                                        |
         rows of misses and of hits with c_g - c_s > s  <--+
                                        v
                 cache.fill --> rows (n, D) --> model --> loss.backward()
                                                              |
        one gradient per unique row --> cache.update (row -= lr g; u += 1)
                                      --> rows with u > s go out with the next sync

Public API: :class:`Embedding`, the configs, :class:`PSClient` and the server helpers.
"""

from __future__ import annotations

import importlib

# each public name and its module, imported on first use (PEP 562): a process that only parses
# a command line or starts others (the launcher, ``het --help``) loads no torch
_PUBLIC = {"CacheConfig": "het.config", "OptimizerConfig": "het.config", "ShardConfig": "het.config",
           "TableConfig": "het.config", "EmbeddingCache": "het.cache", "Embedding": "het.nn", "PSClient": "het.ps",
           "PSError": "het.ps", "ServerProcess": "het.ps.server.process", "ServerThread": "het.ps", "Shard": "het.ps"}


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'het' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


def load_model(path: str, verify: bool | None = None):
    """The trained model of an export (``het export CKPT OUT``): see :func:`het.export.load_model`."""
    from het.export import load_model as load

    return load(path, verify=verify)


__all__ = ["CacheConfig", "Embedding", "EmbeddingCache", "OptimizerConfig", "PSClient", "PSError",
           "ServerProcess", "ServerThread", "Shard", "ShardConfig", "TableConfig", "load_model"]
__version__ = "0.1.0"
