"""A shard forgets sessions idle past ``session_idle_s``, and refuses them when they come back."""

import numpy as np
import pytest

from het.config import ShardConfig, TableConfig
from het.ps.protocol.messages import ERROR, OK, Message, Op, decode, encode
from het.ps.server.sessions import SessionExpired, Seen
from het.ps.server.shard import Shard

SECRET = b"correct horse battery staple"
TABLE = TableConfig("t", rows=64, dim=2)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_clock(shard) -> Clock:
    """The shard's sessions on a clock the test moves, at 0."""
    clock = Clock()
    shard.sessions.seen._clock, shard.sessions.seen._checked_at = clock, 0.0
    return clock


def request(shard, op, meta, arrays, session, seq, secret=SECRET):
    fresh = {"nonce": shard.nonce, "session": session, "seq": seq}
    frames = shard.handle_frames(encode(Message(op, seq, {**meta, **fresh}, arrays), secret))
    return decode(frames, secret, what="reply")


def push(shard, session, seq, key=1, secret=SECRET):
    return request(shard, Op.PUSH, {"table": "t"}, [np.array([key]), np.ones((1, 2), np.float32), np.array([1])],
                   session, seq, secret)


@pytest.mark.parametrize("secret", [SECRET, None])
def test_ten_thousand_idle_sessions_are_forgotten_and_a_returning_one_is_refused(secret):
    shard = Shard(ShardConfig((TABLE,), session_idle_s=60), secret=secret)
    clock = fake_clock(shard)
    names = [f"{i:032x}" for i in range(10_000)]
    for name in names:
        assert push(shard, name, 1, secret=secret).status == OK
    assert shard.stats_dict()["sessions"] == 10_000 and len(shard.sessions.applied) == 10_000
    clock.now = 30.0
    assert push(shard, names[-1], 2, secret=secret).status == OK  # one stays busy
    clock.now = 61.0
    assert push(shard, "n" * 32, 1, secret=secret).status == OK  # a new session meanwhile: served
    stats = shard.stats_dict()
    assert stats["sessions"] == 2 and stats["sessions_forgotten"] == 9_999
    assert len(shard.sessions.applied) == 2 and len(shard.sessions.freshness.sessions) == (2 if secret else 0)
    clocks = shard.tables["t"].stats()
    refused = push(shard, names[0], 2, secret=secret)
    assert refused.status == ERROR and "forgotten by this shard (idle past 60 s" in refused.meta["error"]
    assert shard.tables["t"].stats() == clocks and stats["expired"] == 0 and shard.stats_dict()["expired"] == 1
    assert push(shard, names[-1], 3, secret=secret).status == OK  # the busy one goes on


def test_sessions_restored_from_a_save_are_forgotten_in_their_turn(tmp_path):
    shard = Shard(ShardConfig((TABLE,), session_idle_s=10), state_dir=str(tmp_path))
    assert push(shard, "a" * 16, 1, secret=None).status == OK
    shard.save(str(tmp_path / "s"))
    shard.close()
    again = Shard(ShardConfig((TABLE,), session_idle_s=10), state_dir=str(tmp_path))
    clock = fake_clock(again)
    again.load(str(tmp_path / "s"))
    assert again.sessions.applied == {"a" * 16: 1} and again.stats_dict()["sessions"] == 1
    clock.now = 11.0
    assert push(again, "b" * 16, 1, secret=None).status == OK
    assert again.sessions.applied == {"b" * 16: 1}
    again.load(str(tmp_path / "s"))  # a save naming a session forgotten since loads, and it counts as seen
    assert again.sessions.applied == {"a" * 16: 1} and push(again, "a" * 16, 2, secret=None).status == OK
    again.close()


def test_the_forgotten_are_remembered_up_to_a_bound_oldest_first():
    clock = Clock()
    seen = Seen(idle_s=1, remembered=3, clock=clock)
    for name in "abcd":
        seen(name * 16)
    clock.now = 2.0
    assert seen.forget_idle() == [c * 16 for c in "abcd"]
    for name in "bcd":
        with pytest.raises(SessionExpired):
            seen(name * 16)
    seen("a" * 16)  # pushed out of the ring: taken as new
    assert len(seen) == 1


def test_a_look_for_idle_sessions_comes_every_tenth_of_the_timeout_at_most_every_minute():
    clock = Clock()
    seen, hour = Seen(idle_s=50, clock=clock), Seen(idle_s=3600, clock=clock)
    clock.now = 4.9
    assert not seen.due()
    clock.now = 5.0
    assert seen.due() and not hour.due()
    clock.now = 60.0
    assert hour.due()


def test_a_session_forgotten_before_a_save_stays_forgotten_after_a_restart_from_it(tmp_path):
    shard = Shard(ShardConfig((TABLE,), session_idle_s=10), state_dir=str(tmp_path))
    clock = fake_clock(shard)
    assert push(shard, "a" * 16, 1, secret=None).status == OK
    clock.now = 11.0
    assert push(shard, "b" * 16, 1, secret=None).status == OK  # "a" is forgotten here
    shard.save(str(tmp_path / "s"))
    rows = shard.tables["t"].weight.clone()
    shard.close()
    again = Shard(ShardConfig((TABLE,), session_idle_s=10), state_dir=str(tmp_path))
    again.load(str(tmp_path / "s"))
    resent = push(again, "a" * 16, 1, secret=None)  # "a"'s push, sent again: it was applied before the save
    assert resent.status == ERROR and "forgotten by this shard" in resent.meta["error"]
    assert again.tables["t"].weight.equal(rows)
    again.close()


def test_sessions_past_the_cap_forget_the_one_seen_longest_ago():
    shard = Shard(ShardConfig((TABLE,), session_idle_s=3600, max_sessions=100), secret=SECRET)
    names = [f"{i:032x}" for i in range(250)]
    for name in names:
        assert push(shard, name, 1).status == OK
    stats = shard.stats_dict()
    assert stats["sessions"] == 100 and stats["sessions_evicted"] == 150
    assert len(shard.sessions.applied) == 100 and len(shard.sessions.freshness.sessions) == 100
    refused = push(shard, names[0], 2)  # evicted: refused, never taken for a new session
    assert refused.status == ERROR and "forgotten by this shard" in refused.meta["error"]
    assert push(shard, names[-1], 2).status == OK
