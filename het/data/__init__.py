"""Data: what a worker trains on, as :class:`~het.data.batch.Batch` (CTR) or graphs.

- CTR: synthetic Criteo-like data with a planted model (:mod:`het.data.synthetic`), and real
  Criteo prepared into memory-mapped arrays (:mod:`het.data.criteo`, ``het data prepare criteo``).
- Raw 64-bit ids: each (field, id) hashed to an int64 key (:mod:`het.data.hashing`), for any
  CTR data set by :class:`het.data.hashed.HashedIds` (``het train --ids hashed``).
- Graphs: Planetoid folders, a documented ``.npz`` format, edge lists and synthetic power-law
  graphs behind :func:`het.data.graph.load`; :mod:`het.data.sampler` samples GraphSAGE's
  neighbourhoods.
- Keys alone: power-law (Zipf) streams for the cache benchmarks (:mod:`het.data.zipf`).
"""
