"""The client sessions a shard remembers, and forgetting the idle ones.

A shard keeps per session the last sequence number it served (replay refusal, with a secret:
:class:`het.ps.protocol.checks.Freshness`) and the last push it applied (a push re-sent after a
restart is applied once). A job that runs
for days sees many sessions come and go: one idle past ``idle_s`` is forgotten, and its id kept
as an 8-byte hash among the last ``remembered`` forgotten ones, so that a request of it that
comes back is refused, naming why, instead of being taken for a new session (whose re-sent
push would then apply twice). The hashes travel in the shard's saves, so a session forgotten
before a save stays forgotten after a restart from it. At most ``max_sessions`` are held: past
that the one seen longest ago is forgotten the same way, so opening sessions cannot grow a
shard's memory without bound.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter

import numpy as np

from het.ps.protocol import checks
from het.ps.protocol.messages import Message, ProtocolError


class SessionExpired(ValueError):
    """A request of a session the shard forgot for being idle."""


class Sessions:
    """A shard's sessions: which requests it reads, which pushes are new, and forgetting.

    Args:
        secret: the shard's (with one, a request must be fresh: :class:`checks.Freshness`).
        idle_s: sessions not heard from for this long are forgotten.
        remembered: forgotten sessions whose return is still refused (the oldest go first).
    """

    def __init__(self, secret: bytes | None, idle_s: float, remembered: int = 1 << 20, clock=time.monotonic,
                 max_sessions: int = 1 << 16):
        self.freshness = checks.Freshness(secret)
        self.nonce = self.freshness.nonce  # this run's: a request naming another was meant for an earlier one
        self.applied: dict[str, int] = {}  # session -> the sequence number of its last push applied
        self.seen = Seen(idle_s, remembered, clock)
        self.max_sessions = max_sessions
        self.counts = Counter(pushes_again=0, expired=0, sessions_forgotten=0, sessions_evicted=0)

    def __len__(self) -> int:
        return len(self.seen)

    def refusal(self, msg: Message) -> ProtocolError | SessionExpired | None:
        """Why a decoded request is refused unread (None: it is not): a forgotten session's, or
        one :class:`checks.Freshness` refuses. Idle sessions are forgotten as their time comes."""
        if self.seen.due():
            gone = self.seen.forget_idle()
            self._drop(gone)
            if gone:  # a dict keeps its table when emptied: copies give the memory back
                self.freshness.sessions, self.applied = dict(self.freshness.sessions), dict(self.applied)
                self.counts["sessions_forgotten"] += len(gone)
        session = msg.meta.get("session")
        if isinstance(session, str):
            try:
                self.seen(session)
            except SessionExpired as e:
                self.counts["expired"] += 1
                return e
            evicted = self.seen.over(self.max_sessions)
            self._drop(evicted)
            self.counts["sessions_evicted"] += len(evicted)
        return self.freshness.refusal(msg)

    def _drop(self, sessions: list[str]) -> None:
        for session in sessions:
            self.freshness.sessions.pop(session, None)
            self.applied.pop(session, None)

    def admit(self, session: str) -> bool:
        """The short path's :meth:`refusal` (:mod:`het.ps.server.hot`): True, and ``session`` seen now,
        for a session seen before while no look for idle ones is due; False: ask :meth:`refusal`."""
        return not self.seen.due() and self.seen.touch(session)

    def new_push(self, session: str, seq: int) -> bool:
        """:meth:`first_time` of a request's checked session and sequence number, uncounted."""
        return seq > self.applied.get(session, 0)

    def first_time(self, meta: dict) -> bool:
        """Whether a push is new: one its session sent before (a re-send to a restarted shard
        that had applied and logged it) is not applied twice. A client re-sends in order, and a
        shard refuses requests meant for its earlier run, so "before" is "not after the last"."""
        session = checks.session(meta)
        if session is None or session[1] > self.applied.get(session[0], 0):
            return True
        self.counts["pushes_again"] += 1
        return False

    def restore(self, applied: dict[str, int], forgotten=None) -> None:
        """The applied pushes a save or log recorded; their sessions count as seen now (also one
        forgotten since: the save says what it applied). ``forgotten``: the hashes of the sessions
        forgotten by the save's time (:meth:`Seen.forgotten`), whose requests stay refused."""
        self.applied = dict(applied)
        if forgotten is not None:
            self.seen.remember(np.asarray(forgotten).view(np.uint64))
        for session in self.applied:
            self.seen.mark(session)


class Seen:
    """When each session was last seen, and the hashes of the forgotten ones.

    Example:
        >>> now = [0.0]
        >>> seen = Seen(idle_s=10, clock=lambda: now[0])
        >>> seen("a" * 16); now[0] = 11.0; seen("b" * 16)
        >>> seen.forget_idle()
        ['aaaaaaaaaaaaaaaa']
        >>> seen("a" * 16)
        Traceback (most recent call last):
        ...
        het.ps.server.sessions.SessionExpired: session 'aaaaaaaaaaaaaaaa' was forgotten by this shard (idle past 10 s, or the longest unseen when it held too many); its requests are refused (a re-sent push could apply twice): start a new session (reconnect)
    """

    def __init__(self, idle_s: float, remembered: int = 1 << 20, clock=time.monotonic):
        self.idle_s, self._clock = idle_s, clock
        self._last: dict[str, float] = {}      # session -> when last seen (insertion order: first seen)
        self._forgotten = np.zeros(remembered, dtype=np.uint64)  # a ring of forgotten sessions' hashes
        self._next = 0                         # where the ring writes next
        self._count = 0                        # hashes in the ring
        self._checked_at = clock()

    def __len__(self) -> int:
        return len(self._last)

    def __call__(self, session: str) -> None:
        """A request of ``session`` arrived. SessionExpired if it is one the shard forgot."""
        if session not in self._last and self._count and _hash(session) in self._forgotten[:self._count]:
            raise SessionExpired(f"session {session!r} was forgotten by this shard (idle past {self.idle_s:g} s, or the "
                                 f"longest unseen when it held too many); its requests are refused (a re-sent push "
                                 f"could apply twice): start a new session (reconnect)")
        self.mark(session)

    def touch(self, session: str) -> bool:
        """``session`` seen now if it was seen before (True); False for one not known."""
        if session not in self._last:
            return False
        self.mark(session)
        return True

    def mark(self, session: str) -> None:
        """``session`` seen now, whether forgotten before or not."""
        self._last.pop(session, None)  # to the end: the dict stays ordered by last sight
        self._last[session] = self._clock()

    def due(self) -> bool:
        """Whether a look for idle sessions is due (every tenth of ``idle_s``, at most every minute)."""
        return self._clock() - self._checked_at >= min(60.0, self.idle_s / 10)

    def forget_idle(self) -> list[str]:
        """Forget the sessions idle past ``idle_s``; their ids (the caller drops what it keeps of them)."""
        now = self._clock()
        self._checked_at = now
        gone = []
        for session, last in self._last.items():  # oldest sight first: stop at the first recent one
            if now - last <= self.idle_s:
                break
            gone.append(session)
        for session in gone:
            del self._last[session]
        self.remember(np.array([_hash(s) for s in gone], np.uint64))
        if gone:  # a dict keeps its table when emptied: a copy gives the memory back
            self._last = dict(self._last)
        return gone

    def over(self, cap: int) -> list[str]:
        """Forget the sessions seen longest ago while more than ``cap`` are held; their ids."""
        gone = []
        while len(self._last) > cap:
            session = next(iter(self._last))  # ordered by last sight
            del self._last[session]
            gone.append(session)
        self.remember(np.array([_hash(s) for s in gone], np.uint64))
        return gone

    def remember(self, hashes: np.ndarray) -> None:
        """Add forgotten sessions' hashes to the ring (the oldest go first when it is full)."""
        size = len(self._forgotten)
        hashes = np.asarray(hashes, np.uint64)[-size:]
        self._forgotten[(self._next + np.arange(len(hashes))) % size] = hashes
        self._next = (self._next + len(hashes)) % size
        self._count = min(self._count + len(hashes), size)

    def forgotten(self) -> np.ndarray:
        """The forgotten sessions' hashes, oldest first, as int64 (what a save keeps). Shape: (k,)."""
        ring = self._forgotten[:self._count] if self._count < len(self._forgotten) else \
            np.concatenate([self._forgotten[self._next:], self._forgotten[:self._next]])
        return ring.view(np.int64).copy()


def _hash(session: str) -> np.uint64:
    return np.frombuffer(hashlib.blake2b(session.encode(), digest_size=8).digest(), dtype=np.uint64)[0]
