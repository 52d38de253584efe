"""A worker cache's side of L2 as a lazy decay (:mod:`het.decay`): each slot's step.

Every row decays each step, cached or not. A slot records the step its row was last brought to;
a lookup brings its hits to the step it reads (the steps trained), and its fill brings every row
it returns to the steps trained by then (a prefetched lookup is filled a step later); an update
brings the rows it changes to its own step before the local step, as the PS will before the
optimizer's. The
slot's pending gradient sum is brought along with its row: what a push of several steps
carries is then each step's gradient decayed since, which the PS applies at the push's step, so
that under SGD a copy and the PS's row stay equal at any staleness (other optimizers take a sum
of steps as one step anyway). An evicted row's pending sum is brought to the step of the push
that carries it, from the step its slot recorded (read before the lookup reused the slot).
"""

from __future__ import annotations

import torch

from het.decay import RowDecay


class SlotSteps:
    """The step each slot of ``cache`` was last brought to by ``decay``, and the last step seen."""

    def __init__(self, cache, decay: RowDecay):
        self.cache, self.decay = cache, decay
        self.steps = torch.zeros(len(cache.keys), dtype=torch.int64, device=cache.device)
        self.now = 0

    def to(self, device) -> None:
        self.steps = self.steps.to(device)

    def bring(self, slots: torch.Tensor, step: int) -> None:
        """Bring the rows and pending sums of ``slots`` to ``step``, from where each was."""
        c = self.cache
        self.now = max(self.now, step)
        since = self.steps.index_select(0, slots)
        behind = since < step
        if not bool(behind.all()):  # those at the step already stay as they are
            slots, since = slots[behind], since[behind]
        factor = self.decay.factor(since, step).to(c.rows.dtype)[:, None]
        c.rows.index_copy_(0, slots, c.rows.index_select(0, slots) * factor)
        c.pending.index_copy_(0, slots, c.pending.index_select(0, slots) * factor)
        self.steps.index_copy_(0, slots, since.clamp(min=step))

    def bring_dirty(self) -> None:
        """Bring every slot with unpushed updates to the last step seen (before a flush)."""
        self.bring((self.cache.updates > 0).nonzero().flatten(), self.now)

    def victims(self, keys: torch.Tensor) -> tuple:
        """Before a lookup of ``keys``: the sets its misses may evict from (ascending), and the
        keys, held marks and steps of their ways. Shape: -> (m,), (m, W) each."""
        c = self.cache
        sets = c.set_of(keys)
        held = (c._by_set(c.keys, sets) == keys[:, None]) & c._by_set(c.held, sets)
        missed = torch.unique(sets[~held.any(1)])
        return missed, c._by_set(c.keys, missed), c._by_set(c.held, missed), c._by_set(self.steps, missed)

    def looked_up(self, plan, victims: tuple) -> None:
        """After a lookup: its hits brought to the step it reads, the slots its misses took marked
        at it (the PS sends their rows at it), its evicted pending sums brought to the step of the
        push that carries them (the same)."""
        self.bring(plan.slot[plan.hit], plan.as_of)
        placed = plan.slot[~plan.hit]
        self.steps.index_fill_(0, placed[placed >= 0], plan.as_of)
        wb = plan.writeback
        if len(wb):  # each evicted key found in its set's ways as they were before the lookup
            sets, keys, held, steps = victims
            row = torch.searchsorted(sets, self.cache.set_of(wb.keys))
            way = ((keys.index_select(0, row) == wb.keys[:, None]) & held.index_select(0, row)).to(torch.uint8).argmax(1)
            since = steps.index_select(0, row).gather(1, way[:, None])[:, 0]
            wb.grads.mul_(self.decay.factor(since, plan.as_of).to(wb.grads.dtype)[:, None])

    def filling(self, plan, rows: torch.Tensor, now: int) -> torch.Tensor:
        """Before a fill at step ``now``: the PS's ``rows`` (at the lookup's step) and the plan's
        slots brought to it, when steps were trained since the lookup (it was prefetched)."""
        if now <= plan.as_of:
            return rows
        self.bring(plan.slot[plan.slot >= 0], now)
        return rows * self.decay.factor(torch.full((len(rows),), plan.as_of, device=rows.device),
                                        now).to(rows.dtype)[:, None]

    def updating(self, plan, step: int) -> None:
        """Before an update at ``step``: the rows it changes brought to it."""
        c = self.cache
        if not c.num_sets:
            return
        slot = plan.slot.clamp(min=0)
        live = (plan.slot >= 0) & (c.keys.index_select(0, slot) == plan.keys) & c.held.index_select(0, slot)
        self.bring(slot[live], step)
