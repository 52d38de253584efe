"""Models, one file each; every model is handed its embedding module."""

from het.models.wdl import WideDeep

__all__ = ["WideDeep"]
