"""Models, one file each; every model is handed its embedding module."""

from het.models.dcn import DCN
from het.models.deepfm import DeepFM
from het.models.dlrm import DLRM
from het.models.wdl import WideDeep

__all__ = ["DCN", "DLRM", "DeepFM", "WideDeep"]
