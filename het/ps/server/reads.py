"""The arrays a shard answers a read with (a PULL, a SYNC's refreshed rows), from a table's store.

A row goes as float32, or as its 16 bits where the table stores it in half precision
(:mod:`het.ps.protocol.halves`); with ``lazy``, a row no push touched stays behind for the client to
build from the table's seed (:mod:`het.ps.protocol.messages`). A table whose rows decay
(:mod:`het.decay`) sends every row as float32 (half rows widened), brought to the step the read
names: a row no push touched has decayed too, so none is left for the client to build.
"""

from __future__ import annotations

import torch

from het.ps.protocol.integers import narrow
from het.ps.protocol.messages import pack_marks
from het.ps.server.store.rowstore import RowStore, sent_of
from het.staleness import must_refresh


def rows_of(t: RowStore, at: torch.Tensor, lazy: bool, step: int | None) -> tuple[list, int]:
    """:meth:`RowStore.rows_to_send` of the rows ``at`` (half rows as their bits); a table whose
    rows decay sends them all, brought to ``step`` (None: the last step a push to it named)."""
    if not t.optimizer.decay.active:
        return t.rows_to_send(at, lazy, half=True)
    (rows, *_), sent = t.rows_to_send(at, False)
    step = t.step if step is None else step
    return [t.optimizer.decay.bring(torch.from_numpy(rows), t.decayed_to(at), step).numpy()], sent


def pull_arrays(t: RowStore, at: torch.Tensor, lazy: bool, step: int | None) -> tuple[list, int]:
    """A PULL's reply arrays for the rows ``at``, and how many rows travelled: the rows, their
    clocks in the narrowest integers that hold them, and with ``lazy`` the built marks."""
    reply = None if t.optimizer.decay.active else t.pull_reply(at, lazy)
    if reply is not None:
        return reply
    rows, sent = rows_of(t, at, lazy, step)
    return [rows[0], narrow(t.clocks_of(sent_of(at, rows, sent))).numpy(), *pack_marks(rows[1:])], sent


def sync_arrays(t: RowStore, at: torch.Tensor, sent: torch.Tensor, bound: float, lazy: bool, state: str | None,
                step: int | None) -> tuple[list, torch.Tensor, int]:
    """A SYNC's reply arrays for the rows ``at`` whose copies hold clocks ``sent``: the index of
    those more than ``bound`` updates behind (and the misses), their rows, clocks (and the
    optimizer ``state`` asked), then with ``lazy`` the built marks; the index, and how many rows
    travelled."""
    server = t.clocks_of(at)
    index = must_refresh(server, sent, bound).nonzero().flatten()
    rows, n_sent = rows_of(t, at.index_select(0, index), lazy, step)
    index_sent = sent_of(index, rows, n_sent)
    sent_state = [] if state is None else [t.local_state(at.index_select(0, index_sent), state == "full")]
    return ([narrow(index).numpy(), rows[0], narrow(server.index_select(0, index_sent)).numpy(), *sent_state,
             *pack_marks(rows[1:])], index, n_sent)
