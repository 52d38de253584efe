"""Use what was trained: an export of a checkpoint (``het export``), the model loaded from it
(:func:`load_model`), and batch scoring (``het predict``).

An export is a self-contained directory (:mod:`het.export.layout`): the dense model, each
table's rows memory-mapped from disk (fp32, fp16 or int8), a dynamic table's key index, and the
input spec that turns raw values into keys as training did.
"""

from __future__ import annotations

import importlib


def __getattr__(name: str):  # PEP 562: ``het export --help`` and the launcher load no torch
    if name in __all__:
        return getattr(importlib.import_module("het.export.model"), name)
    raise AttributeError(f"module 'het.export' has no attribute {name!r}")


__all__ = ["ExportedModel", "load_model"]
