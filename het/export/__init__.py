"""Use what was trained: an export of a checkpoint (``het export``), the model loaded from it
(:func:`load_model`), and batch scoring (``het predict``).

An export is a self-contained directory (:mod:`het.export.layout`): the dense model, each
table's rows memory-mapped from disk (fp32, fp16 or int8), a dynamic table's key index, and the
input spec that turns raw values into keys as training did.
"""

from het.export.model import ExportedModel, load_model

__all__ = ["ExportedModel", "load_model"]
