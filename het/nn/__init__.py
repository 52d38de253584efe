"""Model building blocks; het.Embedding is the one that talks to the PS."""

from het.nn.bags import FieldBags
from het.nn.embedding import Embedding

__all__ = ["Embedding", "FieldBags"]
