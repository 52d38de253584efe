"""The field embeddings a CTR model reads, of one width or of several.

An embedding of one width gives the model one tensor ``(B, F, D)``. Tables of several widths
(:class:`het.nn.fields.FieldTables`) give one tensor a width, ``(B, F_g, D_g)``, in the order of
their widths; a model's ``dim`` is then the width of each field in that order, so a model knows
the groups it will get before it sees a batch. What reads every field (an MLP, a cross network)
reads them flattened side by side; what pairs fields (the FM term, DLRM's dot products) needs one
width, and gets it by a linear projection of each narrower group, as DeepCTR's and TorchRec's
models project their tables to one interaction width.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def width_groups(num_fields: int, dim: int | Sequence[int]) -> list[tuple[int, int]]:
    """``(fields, width)`` of each group, in order: one group for an int ``dim``, else the runs
    of equal widths of the per-field ``dim``.

    Example:
        >>> width_groups(3, 8), width_groups(3, (4, 4, 16))
        ([(3, 8)], [(2, 4), (1, 16)])
    """
    if isinstance(dim, int):
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        return [(num_fields, dim)]
    widths = [int(w) for w in dim]
    if len(widths) != num_fields or min(widths, default=1) < 1:
        raise ValueError(f"dim: expected one width >= 1 for each of the {num_fields} fields, got {tuple(dim)}")
    groups: list[tuple[int, int]] = []
    for w in widths:
        if groups and groups[-1][1] == w:
            groups[-1] = (groups[-1][0] + 1, w)
        else:
            groups.append((1, w))
    return groups


class FieldRows(nn.Module):
    """What a model does with its embedding's output: the fields flattened, and the fields at one
    width for a pairwise interaction.

    Args:
        num_fields: categorical fields.
        dim: one width, or each field's width in the embedding's output order.
        common: the interaction width, or ``None`` when nothing pairs fields; groups narrower or
            wider than it are projected (a linear map a group, no bias), groups at it are not.

    Example:
        >>> rows = FieldRows(3, (2, 2, 4), common=4)
        >>> groups = (torch.ones(1, 2, 2), torch.ones(1, 1, 4))
        >>> rows.flat(groups).shape, rows.paired(groups).shape, rows.width
        (torch.Size([1, 8]), torch.Size([1, 3, 4]), 8)
    """

    def __init__(self, num_fields: int, dim: int | Sequence[int], common: int | None = None):
        super().__init__()
        self.groups = width_groups(num_fields, dim)
        self.width = sum(f * w for f, w in self.groups)  # the flattened fields
        self.common = common
        self.project = None
        if common is not None and any(w != common for _, w in self.groups):
            self.project = nn.ModuleList(nn.Identity() if w == common else nn.Linear(w, common, bias=False)
                                         for _, w in self.groups)

    def split(self, out) -> list[torch.Tensor]:
        """The embedding's output as its groups, each checked against the widths declared."""
        groups = [out] if isinstance(out, torch.Tensor) else list(out)
        shapes = [tuple(g.shape[1:]) for g in groups]
        if shapes != [(f, w) for f, w in self.groups]:
            raise ValueError(f"the embedding gave field rows of shapes {shapes}, the model expects "
                             f"{[(f, w) for f, w in self.groups]} (fields, width) after the batch")
        return groups

    def flat(self, out) -> torch.Tensor:
        """Every field's row side by side: ``(B, sum of F_g * D_g)``."""
        groups = self.split(out)
        if len(groups) == 1:
            return groups[0].flatten(1)
        return torch.cat([g.flatten(1) for g in groups], dim=1)

    def paired(self, out) -> torch.Tensor:
        """Every field's row at the interaction width: ``(B, F, common)``."""
        groups = self.split(out)
        if self.project is None:
            return groups[0] if len(groups) == 1 else torch.cat(groups, dim=1)
        return torch.cat([p(g) for p, g in zip(self.project, groups)], dim=1)


def interaction_width(dim: int | Sequence[int]) -> int:
    """The width fields are paired at: ``dim`` itself, or the widest field's width."""
    return dim if isinstance(dim, int) else max(int(w) for w in dim)
