"""Sparse optimizers applied by a PS shard to pushed gradients, one row at a time.

Each follows the torch optimizer a user would otherwise pair with
``nn.Embedding(sparse=True)``: ``SGD`` as ``torch.optim.SGD``, ``Adagrad`` as
``torch.optim.Adagrad`` (per-row sum of squares) and ``Adam`` as ``torch.optim.SparseAdam``
(lazy: only pushed rows move; bias correction uses the pushing worker's step number, as
SparseAdam uses its global step count). ``RowWiseAdagrad`` is FBGEMM's and TorchRec's row-wise
Adagrad: one accumulator per row, the mean of the squared gradient over its coordinates, so its
state is one float a row instead of one a coordinate (torch has no such optimizer). ``FTRL`` is FTRL-Proximal with
per-coordinate L1 and L2. Their torch references are in :mod:`het.ps.server.store.torch_optim`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from het import memory
from het.adagrad import adagrad_factor
from het.config import OptimizerConfig
from het.decay import DECAYED, RowDecay, state_of, steps_of
from het.ps.protocol import limits


class SparseOptimizer:
    """Base: holds per-row state tensors; ``apply`` updates ``weight[rows]`` in place."""

    state_names: tuple[str, ...] = ()
    accepts_duplicates = False  # True: `apply` may get repeated rows (summed), no coalescing needed
    followed = False  # True: `local_state` gives what a worker's cache follows this optimizer with
    takes_squares = False  # True: given their squares, a push's rows of several steps take them apart

    def takes_steps(self, counts: torch.Tensor, sq: torch.Tensor | None) -> bool:
        """Whether a push goes to ``apply`` with :class:`Pushed`: it carries the squares ``sq``
        of the steps its rows sum, some row sums several (``counts``), and this optimizer takes
        them apart (Adagrad, Adam)."""
        return (self.followed or self.takes_squares) and sq is not None and bool((counts > 1).any())

    def __init__(self, cfg: OptimizerConfig, num_rows: int, dim: int, started: bool = True):
        """``started``: the rows start with :meth:`initial_state`; False: the state is left
        unwritten, each row to be started by :meth:`start_rows` before it is read (a table
        built on first touch)."""
        self.cfg = cfg
        # L2 as a lazy decay (het.decay): each row's state holds the step it was last brought to
        self.decay = RowDecay(cfg)
        if self.decay.active:
            self.state_names = (*type(self).state_names, DECAYED)
        self.state = (self.initial_state(num_rows, dim) if started else
                      {n: memory.empty(num_rows, w) for n, w in self.state_widths(dim).items()})

    def initial_value(self, name: str) -> float:
        """The value state ``name`` holds in a row no gradient reached yet."""
        return 0.0

    def _initial(self, name: str) -> float:
        return 0.0 if name == DECAYED else self.initial_value(name)  # a row never decayed: at step 0

    def initial_state(self, num_rows: int, dim: int) -> dict[str, torch.Tensor]:
        """The state of ``num_rows`` rows no gradient reached yet: (num_rows, width) each."""
        return {n: memory.full((num_rows, w), self._initial(n)) for n, w in self.state_widths(dim).items()}

    def start_rows(self, rows: torch.Tensor) -> None:
        """Give ``rows`` (of the optimizer's own state) the state of rows no gradient reached yet."""
        for n, v in self.state.items():
            v.index_fill_(0, rows, self._initial(n))

    def state_widths(self, dim: int) -> dict[str, int]:
        """Each state tensor's floats per row: ``dim`` (one per coordinate) or 1 (one per row)."""
        return {**self.widths(dim), **({DECAYED: 2} if self.decay.active else {})}  # het.decay.steps_of

    def widths(self, dim: int) -> dict[str, int]:
        """:meth:`state_widths` of the optimizer's own rule (the decay's step aside)."""
        return {n: dim for n in type(self).state_names}

    def update(self, weight: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor, step: int,
               state: dict | None = None, pushed: "Pushed | None" = None) -> None:
        """:meth:`apply`, the rows first brought to ``step`` by the decay (:mod:`het.decay`)."""
        if self.decay.active:
            self.bring(weight, rows, step, state)
        self.apply(weight, rows, grads, step, state, pushed)

    def bring(self, weight: torch.Tensor, rows: torch.Tensor, step: int, state: dict | None = None) -> None:
        """Decay ``weight[rows]`` to ``step`` from the step each was last brought to, and record it."""
        at = (state or self.state)[DECAYED]
        rows = torch.unique(rows) if self.accepts_duplicates else rows
        since = steps_of(at.index_select(0, rows))
        weight.index_copy_(0, rows, self.decay.bring(weight.index_select(0, rows), since, step))
        at.index_copy_(0, rows, state_of(since.clamp(min=int(step))))

    def apply(self, weight: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor, step: int,
              state: dict | None = None, pushed: "Pushed | None" = None) -> None:
        """Update ``weight[rows]`` with ``grads`` (which it may overwrite); ``rows`` are unique
        unless ``accepts_duplicates``. ``state``: the per-row state to use and update instead of
        the optimizer's own (a dynamic table gathers its rows' state). ``pushed``: how many
        steps each gradient sums and their squares (see :class:`Pushed`); an optimizer that
        does not follow them applies the sum as one step. Shape: (n,), (n, D)."""
        raise NotImplementedError

    def local_state(self, state: dict, full: bool) -> torch.Tensor | None:
        """What a worker's cache needs of ``state`` (the per-row state of some rows) to update
        its copies as this optimizer will (het.cache.cache, ``local_update``): ``full``, the
        accumulator per coordinate (m, D); else one float a row (m, 1). None: this optimizer
        has no such rule (its copies use the SGD step)."""
        return None

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        for n in self.state_names:
            if state[n].shape != self.state[n].shape:
                raise ValueError(f"optimizer state {n!r}: expected shape {tuple(self.state[n].shape)}, "
                                 f"got {tuple(state[n].shape)}")
            self.state[n] = state[n].clone()


@dataclass
class Pushed:
    """What a push of summed gradients says of the steps it sums, for an Adagrad table:
    ``counts`` (n,), the steps of each row, and ``sq`` (n, 1) or (n, D), the sum of their
    squared gradients (the mean over the row, or per coordinate). With them Adagrad takes the
    steps' worth of its rule (:func:`adagrad_factor`) instead of one step of their sum, whose
    square overstates the accumulator by up to the number of steps; Adam takes the steps
    (:func:`adam_steps`) instead of one step worth about one."""

    counts: torch.Tensor
    sq: torch.Tensor


class SGD(SparseOptimizer):
    accepts_duplicates = True  # a sum of steps is the step of the sum

    def apply(self, weight, rows, grads, step, state=None, pushed=None):
        weight.index_add_(0, rows, grads.mul_(-self.cfg.lr_at(step)))  # grads are the shard's own buffer


class Adagrad(SparseOptimizer):
    state_names = ("sum",)

    def initial_value(self, name):
        return float(self.cfg.initial_accumulator)

    followed = True

    def local_state(self, state, full):
        return state["sum"] if full else state["sum"].mean(1, keepdim=True)

    def apply(self, weight, rows, grads, step, state=None, pushed=None):
        acc = (state or self.state)["sum"]
        if sums_several_steps(pushed):
            sq = grads * grads
            if pushed.sq.shape[1] == 1:  # the steps' squares shared out in proportion to the sum's
                mean = sq.mean(1, keepdim=True)
                sq = torch.where(mean > 0, sq * (pushed.sq / mean), pushed.sq.expand_as(sq))
            else:
                sq = pushed.sq
            return _adagrad_steps(weight, acc, rows, grads, torch.where(pushed.counts[:, None] > 1, sq, grads * grads),
                                  pushed.counts, self.cfg, step)
        acc.index_add_(0, rows, grads * grads)
        std = acc.index_select(0, rows).sqrt_().add_(self.cfg.eps)
        weight.index_add_(0, rows, grads / std, alpha=-self.cfg.lr_at(step))


class RowWiseAdagrad(SparseOptimizer):
    """Adagrad with one accumulator per row (FBGEMM's ``rowwise_adagrad``): ``sum += mean(g^2)``
    over the row's coordinates, then ``row -= lr * g / (sqrt(sum) + eps)``."""

    state_names = ("sum",)

    def widths(self, dim):
        return {"sum": 1}

    def initial_value(self, name):
        return float(self.cfg.initial_accumulator)

    followed = True

    def local_state(self, state, full):
        return state["sum"]

    def apply(self, weight, rows, grads, step, state=None, pushed=None):
        acc = (state or self.state)["sum"]
        if sums_several_steps(pushed):
            sq = pushed.sq if pushed.sq.shape[1] == 1 else pushed.sq.mean(1, keepdim=True)
            one = (grads * grads).mean(1, keepdim=True)
            return _adagrad_steps(weight, acc, rows, grads, torch.where(pushed.counts[:, None] > 1, sq, one),
                                  pushed.counts, self.cfg, step)
        acc.index_add_(0, rows, (grads * grads).mean(1, keepdim=True))
        std = acc.index_select(0, rows).sqrt_().add_(self.cfg.eps)
        weight.index_add_(0, rows, grads / std, alpha=-self.cfg.lr_at(step))


class Adam(SparseOptimizer):
    state_names = ("exp_avg", "exp_avg_sq")
    takes_squares = True

    def apply(self, weight, rows, grads, step, state=None, pushed=None):
        b1, b2 = self.cfg.betas
        m, v = (state or self.state)["exp_avg"], (state or self.state)["exp_avg_sq"]
        if pushed is not None:  # rows of several steps take them; the others one step, as always
            many = pushed.counts > 1
            adam_steps(weight, m, v, rows[many], grads[many], pushed.counts[many], pushed.sq[many],
                        max(int(step), 1), self.cfg)
            rows, grads = rows[~many], grads[~many]
        old_m, old_v = m.index_select(0, rows), v.index_select(0, rows)
        new_m = old_m.add_((grads - old_m).mul_(1 - b1))  # old + (1 - b1) (g - old), as SparseAdam
        new_v = old_v.add_((grads * grads - old_v).mul_(1 - b2))
        m.index_copy_(0, rows, new_m)
        v.index_copy_(0, rows, new_v)
        step = max(int(step), 1)
        step_size = self.cfg.lr_at(step) * math.sqrt(1 - b2 ** step) / (1 - b1 ** step)
        weight.index_add_(0, rows, new_m / new_v.sqrt().add_(self.cfg.eps), alpha=-step_size)


class FTRL(SparseOptimizer):
    """FTRL-Proximal per coordinate (McMahan et al., KDD 2013, Algorithm 1), the optimizer of
    Google's ad click paper and of Monolith, on pushed rows: with ``alpha = lr``,

        sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;   z += g - sigma * w;   n += g^2
        w = 0 where |z| <= l1, else -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)

    A coordinate no gradient reached (``n`` 0) keeps its initial value. Its regularisation is
    exactly lazy: a row no push touches would not move under the steps it missed (their
    gradients are 0, so ``z`` and ``n`` stay), so applying it only at pushes equals applying it
    every step. Without L1, a step is Adagrad's with ``eps = beta + alpha * l2`` (the closed form
    moved by one step of g: ``w - alpha g / (beta + sqrt(n + g^2) + alpha l2)``), so a push summing
    several steps moves ``w`` by Adagrad's rule for several steps (:func:`het.adagrad.adagrad_factor`)
    and ``z`` follows from the closed form: what a worker's copy, following Adagrad's rule,
    predicts. With L1 such a push is one step of the sum."""

    state_names = ("z", "n")
    followed = True  # its sum of squares, as Adagrad's accumulator: a worker's copies follow Adagrad's rule

    def local_state(self, state, full):
        return state["n"] if full else state["n"].mean(1, keepdim=True)

    def apply(self, weight, rows, grads, step, state=None, pushed=None):
        sq = None
        if sums_several_steps(pushed):  # the sum of squares grows by the steps' squares, not the sum's
            sq = grads * grads
            if pushed.sq.shape[1] == 1:  # shared out in proportion to the sum's, as Adagrad's
                mean = sq.mean(1, keepdim=True)
                sq = torch.where(mean > 0, sq * (pushed.sq / mean), pushed.sq.expand_as(sq))
            else:
                sq = pushed.sq
            sq = torch.where(pushed.counts[:, None] > 1, sq, grads * grads)
        ftrl_step(weight, (state or self.state)["z"], (state or self.state)["n"], rows, grads, self.cfg, sq,
                  pushed.counts if sq is not None else None)


def ftrl_step(weight, z, n, rows, grads, cfg, sq=None, counts=None) -> None:
    """One FTRL-Proximal step of unique ``rows`` (see :class:`FTRL`); ``sq``: what the sum of
    squares grows by, when ``grads`` sum several steps (default: their square); ``counts``:
    the steps each row's gradient sums (without L1, rows of several move by Adagrad's rule).
    Shape: (k,), (k, D), sq (k, D), counts (k,)."""
    w, old_n = weight.index_select(0, rows), n.index_select(0, rows)
    new_n = old_n + (grads * grads if sq is None else sq)
    sigma = (new_n.sqrt() - old_n.sqrt()) / cfg.lr
    new_z = z.index_select(0, rows) + grads - sigma * w
    shrunk = new_z - new_z.sign() * cfg.l1
    solved = -shrunk / ((cfg.beta + new_n.sqrt()) / cfg.lr + cfg.l2)
    new_w = torch.where(new_z.abs() <= cfg.l1, torch.zeros_like(w), solved)
    if counts is not None and cfg.l1 == 0 and bool((counts > 1).any()):
        several = counts[:, None] > 1
        eps = cfg.beta + cfg.lr * cfg.l2
        several = several & (new_n > 0)  # a coordinate no gradient has reached keeps w and z (factor 1/0)
        moved = w - cfg.lr * grads * adagrad_factor(old_n, new_n - old_n, counts[:, None], eps)
        new_w = torch.where(several, moved, new_w)
        new_z = torch.where(several, -moved * ((cfg.beta + new_n.sqrt()) / cfg.lr + cfg.l2), new_z)
    z.index_copy_(0, rows, new_z)
    n.index_copy_(0, rows, new_n)
    weight.index_copy_(0, rows, torch.where(new_n > 0, new_w, w))


ADAM_POINTS = 8  # a push's first steps taken one by one, and the runs the rest is taken in


def adam_steps(weight, m, v, rows, grads, counts, sq, step, cfg) -> None:
    """``counts`` (>= 2) lazy Adam steps of each row, their gradients summed in ``grads`` and
    their squares in ``sq`` ((n, 1): the row's mean, shared over its coordinates as the mean
    gradient's squares are; or (n, D)), the last at ``step``. Each step is taken with the mean
    gradient ``g = grads / u`` and the mean square ``sq / u``: the moments after them are
    exact for such steps (``m_u = b1^u m_0 + (1 - b1^u) g``, ``v`` alike); the row's move, the
    sum of the steps' bias-corrected ``m_k / (sqrt(v_k) + eps)``, is taken step by step for the
    first ADAM_POINTS steps and over ADAM_POINTS runs of the rest, each at its middle step times
    its length (exact up to ADAM_POINTS steps).

    Pushed as one step, a sum of ``u`` steps moves a row about one step's worth, not ``u``
    (HET's loss under Adam); taken apart with the mean gradient's square for ``v``, the noise
    the steps averaged out is lost and the row moves too far: the squares are what make it
    right. The powers come from tables built in Python, so a row gets the same bits whatever
    else a push holds (torch's vectorised pow differs in a tensor's tail)."""
    old_m, old_v = m.index_select(0, rows), v.index_select(0, rows)
    top = int(counts.max())
    p1, p2, sizes = adam_tables(top, step, cfg)
    u = counts[:, None]
    g = grads / u.to(grads.dtype)
    gsq, per_step = g * g, sq / u.to(grads.dtype)
    if sq.shape[1] == 1:  # the steps' mean square, shared over the coordinates as the mean gradient's
        mean = gsq.mean(1, keepdim=True)
        gsq = torch.where(mean > 0, gsq * (per_step / mean.clamp(min=1e-30)), per_step.expand_as(gsq))
    else:
        gsq = per_step
    move = torch.zeros_like(g)
    rest = (u - ADAM_POINTS).clamp(min=0)  # the steps after the first ADAM_POINTS, where moments settle
    for j in range(2 * ADAM_POINTS):
        if j < ADAM_POINTS:  # the first steps one by one: the moments move most there
            first, end = torch.full_like(u, j).clamp(max=u), torch.full_like(u, j + 1).clamp(max=u)
        else:  # the rest in runs, each at its middle step
            i = j - ADAM_POINTS
            first, end = ADAM_POINTS + rest * i // ADAM_POINTS, ADAM_POINTS + rest * (i + 1) // ADAM_POINTS
        k = torch.minimum((first + (end - first + 1) // 2).clamp(min=1), u)  # a run of none weighs 0
        mk = p1[k] * old_m + (1 - p1[k]) * g
        vk = p2[k] * old_v + (1 - p2[k]) * gsq
        move += (end - first).to(g.dtype) * sizes[top - u + k] * mk / (vk.sqrt() + cfg.eps)
    m.index_copy_(0, rows, p1[u] * old_m + (1 - p1[u]) * g)
    v.index_copy_(0, rows, p2[u] * old_v + (1 - p2[u]) * gsq)
    weight.index_add_(0, rows, move, alpha=-1.0)


def adam_tables(top: int, step: int, cfg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`adam_steps`'s float32 tables for pushes of up to ``top`` steps, the last at ``step``:
    ``b1^i`` and ``b2^i`` for i in 0..top, and the bias-corrected step size of step ``step - top + i``."""
    b1, b2 = cfg.betas
    return (torch.tensor([b1 ** i for i in range(top + 1)]), torch.tensor([b2 ** i for i in range(top + 1)]),
            torch.tensor([cfg.lr_at(t) * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                          for t in (max(step - top + i, 1) for i in range(top + 1))]))


def sums_several_steps(pushed: Pushed | None) -> bool:
    """Whether a push sums several steps of some row (one step each is Adagrad's plain rule)."""
    return pushed is not None and bool((pushed.counts > 1).any())


def _adagrad_steps(weight, acc, rows, grads, sq, counts, cfg, step: int = 1) -> None:
    """Adagrad's steps summed in ``grads``: the accumulator grows by ``sq`` and the rows move by
    ``-lr * grads * adagrad_factor``. Shape: rows (n,), grads (n, D), sq like acc's rows."""
    factor = adagrad_factor(acc.index_select(0, rows), sq, counts[:, None], cfg.eps)
    acc.index_add_(0, rows, sq)
    weight.index_add_(0, rows, grads * factor, alpha=-cfg.lr_at(step))


def sum_rows(values: torch.Tensor, inverse: torch.Tensor, n: int) -> torch.Tensor:
    """``values`` of duplicate rows summed: row ``inverse[i]`` of the result adds ``values[i]``.
    Shape: (m, ...) -> (n, ...)."""
    return torch.zeros(n, *values.shape[1:], dtype=values.dtype).index_add_(0, inverse, values)


def rows_problem(weight: torch.Tensor, state: dict, clocks: torch.Tensor) -> str:
    """Why updated rows are not fit to keep ('' when they are): a value that is not finite (an
    overflow: huge gradients summed), or a clock past MAX_CLOCK."""
    for name, values in (("rows", weight), *((f"optimizer state {n!r}", v) for n, v in state.items())):
        if not limits.all_finite(values):
            return f"the update would make {name} non-finite (overflow)"
    if len(clocks) and int(clocks.max()) > limits.MAX_CLOCK:
        return f"a clock would pass {limits.MAX_CLOCK}"
    return ""


_BY_NAME = {"sgd": SGD, "adagrad": Adagrad, "rowwise_adagrad": RowWiseAdagrad, "adam": Adam, "ftrl": FTRL}


def make(cfg: OptimizerConfig, num_rows: int, dim: int, started: bool = True) -> SparseOptimizer:
    """The server-side optimizer for a table slice of ``num_rows`` rows of width ``dim``
    (``started``: see :meth:`SparseOptimizer.__init__`)."""
    return _BY_NAME[cfg.name](cfg, num_rows, dim, started)
