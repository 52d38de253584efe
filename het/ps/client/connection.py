"""A client's connection to every shard of a PS: requests out, replies back, nothing of rows.

Each request is fresh (it names its shard's nonce, this client's session and a sequence number
that grows with every request to that shard: how a shard refuses stale and replayed requests
and applies a re-sent push once, see :mod:`het.ps.protocol.auth`) and, with a secret, signed. A
reply is bound to its session: request ids start at a random number per session (a reply
names its request's id, under the MAC), and only a reply to a request sent and not yet
answered is taken; any other (another session's, an earlier run's, one answered already) is
dropped and counted (``stray_replies``). A reply that comes before its wait is kept until then.
With ``reconnect_s`` a shard that stops answering is probed, and one that answers as a new
process (restarted on its write-ahead log) gets again every request it had not answered, and
every part of a push in parts it had not applied whole.
"""

from __future__ import annotations

import itertools
import secrets
import time

from het.ps.protocol.auth import check_secret
from het.ps.protocol.messages import ERROR, AuthError, Message, Op, PSError, decode, encode, frame_bytes
from het.ps.protocol.transport import LocalChannel

# A wait polls its shard in slices this long, so that a stop request (stop_waiting, made by a
# signal handler while the wait blocks) is seen within one slice: one poll of the whole timeout
# would sit it out, as pyzmq resumes its poll after a signal's handler has run.
WAIT_SLICE_S = 0.1
_PROBE_S = 2.0  # with reconnect_s: silence after which a shard is asked whether it restarted


class WaitAbandoned(Exception):
    """A wait for a shard given up because a stop was asked for (:meth:`Connection.stop_waiting`)
    and the shard stayed silent. Not a TimeoutError: the waits that catch one to probe a slow
    or restarted shard must let this through."""


class Connection:
    """Requests to every shard and their replies.

    Args:
        channels: one channel per shard, in shard order (see :mod:`het.ps.protocol.transport`).
        timeout_s: how long :meth:`reply` waits for a shard before raising TimeoutError.
        secret: the shards' shared secret (bytes): every request is signed with it, and a reply
            not signed with it raises AuthError.
        reconnect_s: > 0: a shard that stops answering is probed for this long; once it answers
            as a new process, the requests it had not answered are sent again (their pushes
            are applied at most once: the shard knows each session's last).
    """

    def __init__(self, channels: list, timeout_s: float = 30.0, secret: bytes | None = None,
                 reconnect_s: float = 0.0):
        self.channels = list(channels)
        self.timeout_s = timeout_s
        self.secret = check_secret(secret)
        self.reconnect_s = reconnect_s
        self.bytes = {"sent": 0, "received": 0}  # every frame of the requests sent and replies taken
        self._ids = itertools.count(secrets.randbits(62) + 1)  # no other session's reply names one of these
        self._waiting = [set() for _ in self.channels]  # ids sent, not answered yet
        self.stray_replies = 0
        self._inflight = [dict() for _ in self.channels]  # request id -> (op, meta, arrays) unanswered
        self._early = [dict() for _ in self.channels]  # replies that came before their wait
        self.session = secrets.token_hex(16)
        self._seqs = [itertools.count(1) for _ in self.channels]
        self.nonces: list = [None] * len(self.channels)
        self._stop_at: float | None = None  # time.monotonic() of stop_waiting(); None: not asked
        self._stop_grace_s = 1.0

    def next_id(self) -> int:
        return next(self._ids)

    def fresh(self, shard: int) -> dict:
        """What names a request to ``shard`` for the shard's freshness check and its at-most-once
        pushes: this client's session and the next sequence number to that shard."""
        return {"session": self.session, "seq": next(self._seqs[shard])}

    def request(self, shard: int, op: Op, meta: dict, arrays: list) -> int:
        """Send a request (``meta`` holding :meth:`fresh`'s fields) to ``shard``; its id. Kept
        until answered when a restarted shard may need it again."""
        rid = self.next_id()
        if self.reconnect_s:
            self._inflight[shard][rid] = (op, meta, arrays)
        self.send(shard, rid, op, meta, arrays)
        return rid

    def send(self, shard: int, rid: int, op: Op, meta: dict, arrays: list) -> None:
        """Send request ``rid`` as it is, naming the shard's nonce."""
        frames = encode(Message(op, rid, dict(meta, nonce=self.nonces[shard]), arrays), self.secret)
        self.bytes["sent"] += frame_bytes(frames)
        self._waiting[shard].add(rid)
        self.channels[shard].send(frames)

    def send_frames(self, shard: int, rid: int, frames: list, nbytes: int) -> None:
        """Send request ``rid``, its frames (``nbytes`` in all) written by the caller
        (:mod:`het.ps.client.hot`), as :meth:`request` sends one; nothing is kept to send again."""
        self.bytes["sent"] += nbytes
        self._waiting[shard].add(rid)
        self.channels[shard].send(frames)

    def next_seq(self, shard: int) -> int:
        """The sequence number of the next request to ``shard`` (:meth:`fresh`'s)."""
        return next(self._seqs[shard])

    def awaits(self, shard: int, rid: int) -> bool:
        """Whether request ``rid`` to ``shard`` was sent and is not answered or given up yet."""
        return rid in self._waiting[shard]

    def came_early(self, shard: int, rid: int) -> bool:
        """Whether the reply to ``rid`` was taken off the wire before its wait, and is kept."""
        return rid in self._early[shard]

    def next_reply(self, shard: int) -> list:
        """The next frames off ``shard``'s wire, waited for as :meth:`reply` waits (without
        ``reconnect_s``): TimeoutError, WaitAbandoned. The caller reads them (:meth:`read`)
        or hands them back (:meth:`keep`)."""
        return self._recv(shard, self.timeout_s)

    def read(self, shard: int, rid: int, frames) -> None:
        """Count ``frames``, the reply to ``rid`` that the caller read: it is no longer waited for."""
        self.bytes["received"] += frame_bytes(frames)
        self._waiting[shard].discard(rid)

    def keep(self, shard: int, frames) -> None:
        """Frames :meth:`next_reply` gave that the caller did not read: taken as :meth:`reply`
        takes any, kept for their wait (or counted stray)."""
        self._take(shard, frames)

    def broadcast(self, op: Op, meta=lambda i: {}, timeout_s: float | None | str = "default") -> list[Message]:
        """``op`` to every shard (``meta(i)``: shard i's meta), and their replies in shard order.
        INFO names no nonce or session: it is how a client learns the nonces. Any other is kept
        until answered, as every request is: a shard restarted meanwhile gets it again."""
        rids = []
        for i, ch in enumerate(self.channels):
            if op is Op.INFO:
                rid = self.next_id()
                self._waiting[i].add(rid)
                ch.send(encode(Message(op, rid, meta(i)), self.secret))
            else:
                rid = self.request(i, op, {**meta(i), **self.fresh(i)}, [])
            rids.append(rid)
        return [self.reply(i, rid, timeout_s) for i, rid in enumerate(rids)]

    def reply(self, shard: int, rid: int, timeout_s: float | None | str = "default") -> Message:
        """The reply to request ``rid`` of ``shard``, waited for; PSError if the shard refused it.
        A part of a push the shard holds (``staged``) stays to be sent again, should the shard
        restart, until :meth:`done`."""
        early = self._early[shard]
        timeout_s = self.timeout_s if timeout_s == "default" else timeout_s
        while True:
            while rid not in early:
                try:
                    frames = self._recv(shard, timeout_s if not self._inflight[shard] else
                                        min(timeout_s or _PROBE_S, _PROBE_S))
                except TimeoutError:
                    if not self._inflight[shard]:
                        raise
                    self._probe(shard)  # gone, restarted, or only slow
                    continue
                self._take(shard, frames)
            msg = early.pop(rid)
            if not (msg.status == ERROR and msg.meta.get("kind") == "StaleError" and rid in self._inflight[shard]):
                break
            self._probe(shard)  # it reached a restarted shard: learn its nonce, send again
        if not msg.meta.get("staged"):
            self._inflight[shard].pop(rid, None)
        if msg.status == ERROR:
            raise PSError(f"PS shard {shard} ({self.channels[shard].address}) refused {msg.op.name}: "
                          f"{msg.meta.get('kind', 'Error')}: {msg.meta.get('error')}")
        return msg

    def done(self, requests) -> None:
        """Forget ``requests`` (``(shard, id)`` pairs), answered or given up: none is sent again."""
        for shard, rid in requests:
            self._inflight[shard].pop(rid, None)
            self._early[shard].pop(rid, None)
            self._waiting[shard].discard(rid)

    def stop_waiting(self, grace_s: float = 1.0) -> None:
        """Stop waiting for silent shards: from now on a wait raises :class:`WaitAbandoned` once
        its shard has been silent for ``grace_s`` since the later of the call and the wait's
        start, instead of after the full timeout. A shard that answers is still waited for, so a
        stopping worker flushes to a live PS. Safe in a signal handler (it sets two attributes)."""
        self._stop_grace_s = grace_s
        self._stop_at = time.monotonic()

    def close(self) -> None:
        for c in self.channels:
            c.close()

    def _take(self, shard: int, frames) -> None:
        """A reply off the wire, kept until its wait when it answers a request waiting for one."""
        self.bytes["received"] += frame_bytes(frames)
        msg = self._decode(shard, frames)
        if msg.request_id not in self._waiting[shard]:
            self.stray_replies += 1
            return
        self._waiting[shard].discard(msg.request_id)
        self._early[shard][msg.request_id] = msg

    def _probe(self, shard: int) -> None:
        """``shard`` has not answered for a while: ask who it is. The same process: wait on.
        A new one (another nonce: restarted on its write-ahead log): send it the requests it has
        not answered again, same ids and sequence numbers. No answer within ``reconnect_s``:
        TimeoutError."""
        deadline = time.monotonic() + self.reconnect_s
        while True:
            rid = self.next_id()
            self._waiting[shard].add(rid)
            self.channels[shard].send(encode(Message(Op.INFO, rid), self.secret))
            try:
                while rid not in self._early[shard]:
                    self._take(shard, self._recv(shard, _PROBE_S))
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"PS shard {shard} ({self.channels[shard].address}) did not come back "
                                       f"within {self.reconnect_s:g} s") from None
                continue
            nonce = self._early[shard].pop(rid).meta["shard"]["nonce"]
            if nonce != self.nonces[shard]:
                self.nonces[shard] = nonce
                for old, (op, meta, arrays) in sorted(self._inflight[shard].items()):
                    self._early[shard].pop(old, None)  # a stale refusal from the new process, if any
                    self.send(shard, old, op, meta, arrays)
            return

    def _recv(self, shard: int, timeout_s: float | None):
        """The next reply of ``shard``, waited for in slices of :data:`WAIT_SLICE_S`; TimeoutError
        after ``timeout_s`` (None: no limit), WaitAbandoned soon after :meth:`stop_waiting`."""
        channel = self.channels[shard]
        if isinstance(channel, LocalChannel):  # answered inside send: a reply is there or never comes
            return channel.recv(timeout_s)
        start = time.monotonic()
        while True:
            now = time.monotonic()
            if self._stop_at is not None and now - max(start, self._stop_at) >= self._stop_grace_s:
                raise WaitAbandoned(f"gave up waiting for PS shard {shard} ({channel.address}): a stop was "
                                    f"asked for and it sent nothing for {now - max(start, self._stop_at):.1f} s")
            left = None if timeout_s is None else start + timeout_s - now
            if left is not None and left <= 0:
                raise TimeoutError(f"no reply from PS shard at {channel.address} within {timeout_s:g} s "
                                   f"(is `het serve` running there?)")
            try:
                return channel.recv(WAIT_SLICE_S if left is None else min(WAIT_SLICE_S, left))
            except TimeoutError:
                continue

    def _decode(self, shard: int, frames) -> Message:
        """A reply, checked against the secret. A shard that could not authenticate a request
        answers with an unsigned error reply: it is let through, as it can only raise PSError."""
        try:
            return decode(frames, self.secret, what="reply")
        except AuthError as e:
            msg = decode(frames)
            if msg.status != ERROR:
                raise AuthError(f"PS shard {shard} ({self.channels[shard].address}): {e} "
                                f"(does it hold the same shared secret?)") from None
            return msg
