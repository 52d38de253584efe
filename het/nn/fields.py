"""Categorical fields of several widths: one table a width, and the lookup that splits a batch's
keys among them.

A job whose fields all have one width keeps one table (``"embedding"``). Fields of several
widths (``--dim auto``, or widths set per field) get one table a distinct width, named
``"embedding_<width>"``, holding only its fields' keys: a dynamic table takes them as they are (any
int64 is a key), a fixed one numbers its fields' keys from 0 (``shift``), so it holds no row of
another width's field. :class:`FieldTables` looks each group's columns up in its table and gives
the model one tensor a width, as :mod:`het.models.fields` reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from het.nn.bags import FieldBags

BASE_TABLE = "embedding"


@dataclass(frozen=True)
class FieldGroup:
    """The fields of one width and their table.

    Attributes:
        table: the PS table's name.
        width: its rows' width.
        fields: the fields' indices in the data's order.
        columns: their key columns (a field's bag of keys side by side, as the data gives them).
        bag_sizes: keys a field, one a field of the group.
        shift: for a fixed table, what each column's keys lose (a field's first key in the data
            less its first row in the table); ``None`` for a dynamic table.
        rows: a fixed table's rows (its fields' cardinalities summed); ``None``: dynamic.
    """

    table: str
    width: int
    fields: tuple[int, ...]
    columns: tuple[int, ...]
    bag_sizes: tuple[int, ...]
    shift: tuple[int, ...] | None = None
    rows: int | None = None

    def as_dict(self) -> dict:
        return {"table": self.table, "width": self.width, "fields": list(self.fields), "columns": list(self.columns),
                "bag_sizes": list(self.bag_sizes), "shift": None if self.shift is None else list(self.shift),
                "rows": self.rows}

    @classmethod
    def from_dict(cls, d: dict) -> FieldGroup:
        return cls(d["table"], int(d["width"]), tuple(d["fields"]), tuple(d["columns"]), tuple(d["bag_sizes"]),
                   None if d.get("shift") is None else tuple(d["shift"]), d.get("rows"))


def plan_groups(widths: Sequence[int], bag_sizes: Sequence[int] | None = None,
                cardinalities: Sequence[int] | None = None, offsets: Sequence[int] | None = None) -> list[FieldGroup]:
    """The tables of fields of ``widths`` (one a field), one a distinct width, narrowest first.

    ``cardinalities`` and ``offsets`` (field ``f``'s keys are ``offsets[f] ..
    offsets[f] + cardinalities[f] - 1``) make fixed tables of the fields' keys only; without
    them the tables are dynamic and take the keys unchanged.

    Example:
        >>> a, b = plan_groups([8, 16, 8], cardinalities=[3, 5, 2], offsets=[0, 3, 8])
        >>> a.table, a.fields, a.shift, a.rows, b.table, b.shift, b.rows
        ('embedding_8', (0, 2), (0, 5), 5, 'embedding_16', (3,), 5)
        >>> plan_groups([4, 4], bag_sizes=[2, 1])[0].columns
        (0, 1, 2)
    """
    sizes = list(bag_sizes) if bag_sizes is not None else [1] * len(widths)
    if len(sizes) != len(widths):
        raise ValueError(f"{len(widths)} widths for {len(sizes)} fields")
    starts = [sum(sizes[:f]) for f in range(len(sizes))]
    fixed = cardinalities is not None and offsets is not None
    distinct = sorted(set(int(w) for w in widths))
    groups = []
    for w in distinct:
        fields = tuple(f for f, fw in enumerate(widths) if fw == w)
        columns = tuple(c for f in fields for c in range(starts[f], starts[f] + sizes[f]))
        shift = rows = None
        if fixed:
            first, per_field = 0, {}
            for f in fields:
                per_field[f] = int(offsets[f]) - first
                first += int(cardinalities[f])
            shift, rows = tuple(per_field[f] for f in fields for _ in range(sizes[f])), first
        name = BASE_TABLE if len(distinct) == 1 else f"{BASE_TABLE}_{w}"
        groups.append(FieldGroup(name, w, fields, columns, tuple(sizes[f] for f in fields), shift, rows))
    return groups


def group_widths(groups: Sequence[FieldGroup]) -> tuple[int, ...]:
    """Each field's width in the order :class:`FieldTables` returns them (what a model's ``dim``
    is)."""
    return tuple(g.width for g in groups for _ in g.fields)


class _Table(nn.Module):
    """One table of a lookup that holds several: ``(keys, offsets)`` as ``nn.Embedding`` takes
    them. The lookup is held, not registered: its owner registers it once."""

    def __init__(self, source: nn.Module, name: str):
        super().__init__()
        self._source, self.name = [source], name

    def forward(self, keys: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
        source = self._source[0]
        if isinstance(source, nn.ModuleDict):
            table = source[self.name]
            return table(keys) if offsets is None else table(keys, offsets)
        return source(keys, offsets, table=self.name)


class FieldTables(nn.Module):
    """Keys ``(B, L)`` -> one tensor of rows a group ``(B, F_g, D_g)``, each group's columns looked
    up in its table.

    Args:
        source: a :class:`het.nn.Embedding` holding every group's table (looked up with
            ``table=``), or an ``nn.ModuleDict`` of a module a table (``nn.Embedding``, an export's
            table).
        groups: from :func:`plan_groups`.
        pooled: whether each field's bag of keys is pooled into one row (``source`` pools,
            as ``nn.EmbeddingBag``); else a group's fields are one key each.

    A :class:`het.nn.Embedding` source is routed too: its ``announce`` and ``prefetch`` of a
    whole batch's keys go to each table, split as the lookup splits them.

    Example:
        >>> groups = plan_groups([2, 4, 2], cardinalities=[3, 5, 2], offsets=[0, 3, 8])
        >>> tables = nn.ModuleDict({g.table: nn.Embedding(g.rows, g.width) for g in groups})
        >>> out = FieldTables(tables, groups)(torch.tensor([[1, 4, 9], [0, 7, 8]]))
        >>> [tuple(o.shape) for o in out]
        [(2, 2, 2), (2, 1, 4)]
        >>> torch.equal(out[0][0, 1], tables["embedding_2"].weight[9 - 8 + 3])  # field 2's key 9: row 4
        True
    """

    def __init__(self, source: nn.Module, groups: Sequence[FieldGroup], pooled: bool = False):
        super().__init__()
        self.source, self.groups = source, list(groups)
        self.lookups = nn.ModuleList(FieldBags(_Table(source, g.table), g.bag_sizes) if pooled
                                     else _Table(source, g.table) for g in self.groups)
        for i, g in enumerate(self.groups):
            self.register_buffer(f"columns_{i}", torch.tensor(g.columns, dtype=torch.int64), persistent=False)
            shift = None if g.shift is None else torch.tensor(g.shift, dtype=torch.int64)
            self.register_buffer(f"shift_{i}", shift, persistent=False)
        if hasattr(source, "upcoming"):  # a het.Embedding: its announcements and prefetches are split too
            source.upcoming.route(self.split)

    def split(self, keys: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each table's keys of a batch ``(B, L)``: its columns, shifted into its rows."""
        width = sum(len(g.columns) for g in self.groups)
        if keys.dim() != 2 or keys.shape[1] != width:
            raise ValueError(f"expected keys of shape (B, {width}) (every field's keys side by side), "
                             f"got {tuple(keys.shape)}")
        out = {}
        for i, g in enumerate(self.groups):
            part = keys.index_select(1, getattr(self, f"columns_{i}").to(keys.device))
            shift = getattr(self, f"shift_{i}")
            out[g.table] = part if shift is None else part - shift.to(keys.device)
        return out

    def forward(self, keys: torch.Tensor) -> tuple[torch.Tensor, ...]:
        parts = self.split(keys)
        return tuple(lookup(parts[g.table]) for lookup, g in zip(self.lookups, self.groups))
