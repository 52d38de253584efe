"""Worker-side cache: slots, clocks and replacement policies, all vectorised tensor code."""

from het.cache.cache import EmbeddingCache
from het.cache.plan import Plan, Rows
from het.cache.policy import LFU, LRU

__all__ = ["EmbeddingCache", "LFU", "LRU", "Plan", "Rows"]
