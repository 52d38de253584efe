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

from het.cache import EmbeddingCache
from het.config import CacheConfig, OptimizerConfig, ShardConfig, TableConfig
from het.nn import Embedding
from het.ps import PSClient, PSError, ServerProcess, ServerThread, Shard


def load_model(path: str, verify: bool | None = None):
    """The trained model of an export (``het export CKPT OUT``): see :func:`het.export.load_model`."""
    from het.export import load_model as load

    return load(path, verify=verify)


__all__ = ["CacheConfig", "Embedding", "EmbeddingCache", "OptimizerConfig", "PSClient", "PSError",
           "ServerProcess", "ServerThread", "Shard", "ShardConfig", "TableConfig", "load_model"]
__version__ = "0.1.0"
