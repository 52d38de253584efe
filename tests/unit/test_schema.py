"""Every side of a PS message follows its one declaration (het.ps.protocol.schema): the requests
het's client sends and the replies a shard gives, over both paths; the fields the shard reads and
the ones the client reads back; the header the native core is built from. A field added on one
side only is named (the planted tests show each side's)."""

from __future__ import annotations

import ast
import glob
import os

import numpy as np
import pytest
import torch

import het.ps.client.client as client_module
import het.ps.client.hot as client_hot
from het import native
from het.config import TableConfig
from het.optimizer import OptimizerConfig
from het.ps.local import local_client
from het.ps.protocol import schema
from het.ps.protocol.limits import MAX_STEP
from het.ps.protocol.messages import Op, decode
from het.ps.server import hot as server_hot
from het.ps.server.shard import Shard

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TABLES = [TableConfig("t", rows=1000, dim=4), TableConfig("h", rows=1000, dim=4, row_dtype="bf16"),
          TableConfig("a", rows=1000, dim=4, optimizer=OptimizerConfig("adagrad", lr=0.1)),
          TableConfig("d", rows=None, dim=4)]


@pytest.fixture
def recorded(monkeypatch):
    """Every request a shard of this process is sent, with its reply and the shard."""
    seen = []
    handle = Shard.handle_frames

    def recording(self, frames):
        request = [bytes(memoryview(f)) for f in frames]
        reply = handle(self, frames)
        seen.append((request, [bytes(memoryview(f)) for f in reply], self))
        return reply

    monkeypatch.setattr(Shard, "handle_frames", recording)
    return seen


def every_verb(client, tmp_path) -> None:
    """Each of the client's verbs, on each kind of table, by both paths where it has two."""
    gen = torch.Generator().manual_seed(0)
    keys = torch.arange(0, 600, 2)  # ascending: they travel as the steps between them
    mixed = keys[torch.randperm(len(keys), generator=gen)]
    grads, counts = torch.randn(len(keys), 4, generator=gen), torch.ones(len(keys), dtype=torch.int64)
    for table in ("t", "h", "d"):
        for k in (keys, mixed):
            client.wait(client.pull(table, k))
            client.wait(client.push(table, k, grads, counts, step=2))
            client.wait(client.push(table, k, grads, counts, step=3, grad_dtype="bf16"))
            client.wait(client.sync(table, k, torch.full((len(k),), -1), bound=0))
            client.wait(client.push_sync(table, k, grads, counts, k, torch.zeros(len(k), dtype=torch.int64), 1, step=4))
    sq = grads.square()
    client.wait(client.push("a", keys, grads, counts * 2, step=2, sq=sq))
    for state in ("row", "full"):
        client.wait(client.sync("a", keys, torch.zeros(len(keys), dtype=torch.int64), 0, state=state))
        client.wait(client.push_sync("a", keys, grads, counts * 2, keys, torch.zeros(len(keys), dtype=torch.int64),
                                     0, step=3, state=state, sq=sq))
    list(client.changed("t"))
    client.wait(client.push("t", keys, grads, counts, step=5))
    list(client.changed("t"))
    client.stats(report={"stream_auc": 0.5})
    client.save(str(tmp_path / "saved"))
    client.load(str(tmp_path / "saved"))
    client.stop_servers()


def is_hot(msg) -> bool:
    """Whether a request is in the text het's client writes by its short path: a PULL or a PUSH
    of float32 gradients whose fields are just those the schema lists for it."""
    return (msg.op in schema.HOT and set(msg.meta) - {"deltas"} == set(schema.HOT[msg.op]) - {"deltas"}
            and all(a.dtype != np.int16 for a in msg.arrays[1:2]))


def drift(seen) -> list[str]:
    """What of the recorded messages their schema does not declare, and every hot request the
    shard's short readers (native, Python) do not read, in words."""
    out = []
    for request, reply, shard in seen:
        msg, answer = decode(request), decode(reply, what="reply")
        out += schema.request_drift(msg) + schema.reply_drift(msg.op, msg.meta, answer)
        if answer.status:
            out.append(f"{msg.op.name} refused: {answer.meta['error']}")
        if is_hot(msg):
            if native.ops is not None and native.ops.hot_request(request, shard.nonce, MAX_STEP, 1 << 40) is None:
                out.append(f"the native reader does not read a hot {msg.op.name}: {sorted(msg.meta)}")
            if server_hot._read(shard, request, 1 << 40) is None:
                out.append(f"the Python reader does not read a hot {msg.op.name}: {sorted(msg.meta)}")
    return out


@pytest.mark.parametrize("options", [{}, {"max_keys": 64}], ids=["whole", "in-parts"])
def test_every_message_of_every_verb_follows_its_schema(recorded, tmp_path, options):
    every_verb(local_client(TABLES, 2, **options), tmp_path)
    assert drift(recorded) == []
    ops = [decode(r).op for r, _, _ in recorded]
    assert set(ops) == set(Op), "every op was sent"
    hot = [decode(r).op for r, _, _ in recorded if is_hot(decode(r))]
    if not options:
        assert hot.count(Op.PULL) >= 6 and hot.count(Op.PUSH) >= 6, "the short path wrote requests"
    else:
        assert any(decode(r).meta.get("parts") for r, _, _ in recorded), "pushes went in parts"


def test_a_field_the_client_adds_alone_is_named_and_the_shard_refuses_it(recorded, tmp_path, monkeypatch):
    states = client_module._state_meta
    monkeypatch.setattr(client_module, "_state_meta", lambda state: {"hint": True, **states(state)})
    with pytest.raises(Exception, match="a SYNC request has no field 'hint'"):
        every_verb(local_client(TABLES, 1), tmp_path)
    found = drift(recorded)
    assert "SYNC request field 'hint' is not declared" in found
    assert any("a SYNC request has no field 'hint'" in f for f in found)


def test_a_field_the_short_path_adds_alone_is_named(recorded, monkeypatch):
    monkeypatch.setitem(client_hot._TAIL, Op.PULL, '"hint":1,' + client_hot._TAIL[Op.PULL])
    client = local_client(TABLES, 1)
    with pytest.raises(Exception, match="a PULL request has no field 'hint'"):
        client.wait(client.pull("t", torch.arange(10)))
    assert "PULL request field 'hint' is not declared" in drift(recorded)


def test_a_short_path_whose_order_the_readers_do_not_follow_is_named(recorded, monkeypatch):
    """Its fields all declared, but not in the order the schema lists: the shard answers by its
    general path, and the drift is named (the short readers are bypassed)."""
    tail = client_hot._TAIL[Op.PULL]
    swapped = tail.replace('"table":{table},"session":{session},', '"session":{session},"table":{table},')
    assert swapped != tail
    monkeypatch.setitem(client_hot._TAIL, Op.PULL, swapped)
    client = local_client(TABLES, 1)
    client.wait(client.pull("t", torch.arange(10)))
    found = drift(recorded)
    assert "the Python reader does not read a hot PULL" not in " ".join(found)  # any spelling: it reads it
    if native.ops is not None:
        assert any(f.startswith("the native reader does not read a hot PULL") for f in found)


# -- the native core ------------------------------------------------------------------------
WIRE_H = schema.WIRE_H


def header_drift() -> list[str]:
    """How ``het/native/wire.h`` differs from what the schema declares (none: it is the schema's)."""
    with open(WIRE_H) as f:
        built = f.read().splitlines()
    declared = schema.native_header().splitlines()
    return [f"wire.h has {b!r}, the schema declares {d!r}" for b, d in zip(built, declared) if b != d] + (
        [f"wire.h has {len(built)} lines, the schema declares {len(declared)}"] if len(built) != len(declared) else [])


def test_the_native_core_reads_the_schemas_header():
    assert header_drift() == [], "het/native/wire.h is not the schema's: `python -m het.ps.protocol.schema` writes it"
    assert os.path.basename(WIRE_H) in map(os.path.basename, native.sources()), "and the module's hash covers it"


def test_a_field_the_schema_adds_alone_is_named_against_the_native_header(monkeypatch):
    pushed = list(schema.HOT[Op.PUSH])
    monkeypatch.setitem(schema.HOT, Op.PUSH, (*pushed[:-1], "epoch", pushed[-1]))
    assert any("epoch" in f for f in header_drift())


# -- what each side reads -------------------------------------------------------------------
def fields_read(source: str, names: tuple = ("meta",)) -> set[str]:
    """The meta fields ``source`` reads by name: ``meta["x"]``, ``meta.get("x")``, ``"x" in meta``,
    ``f(meta, "x")``, where ``meta`` is a variable of ``names`` or any ``.meta`` attribute."""
    def is_meta(node) -> bool:
        return (isinstance(node, ast.Name) and node.id in names) or (isinstance(node, ast.Attribute)
                                                                       and node.attr == "meta")

    def text(node) -> str | None:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and is_meta(node.value):
            found.add(text(node.slice))
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)) and is_meta(
                node.comparators[0]):
            found.add(text(node.left))
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("get", "pop") and is_meta(f.value) and node.args:
                found.add(text(node.args[0]))
            found.update(text(b) for a, b in zip(node.args, node.args[1:]) if is_meta(a))
    return found - {None, "arrays"}


def read_by(pattern: str, names: tuple = ("meta",)) -> dict[str, set[str]]:
    out = {}
    for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
        with open(path) as f:
            out[os.path.relpath(path, ROOT)] = fields_read(f.read(), names)
    return out


def test_the_shard_reads_every_field_declared_and_no_other():
    reads = read_by("het/ps/server/*.py") | read_by("het/ps/protocol/checks.py")
    undeclared = {path: sorted(f - schema.FIELDS) for path, f in reads.items() if f - schema.FIELDS}
    assert undeclared == {}
    assert schema.FIELDS - set().union(*reads.values()) == set(), "a declared field no shard reads"


def test_the_client_reads_only_reply_fields_declared():
    replies = {f for s in schema.SCHEMAS.values() for f in s.reply_fields} | set(schema.ERROR_FIELDS)
    reads = read_by("het/ps/client/*.py", names=())
    assert {path: sorted(f - replies) for path, f in reads.items() if f - replies} == {}


def test_a_field_the_shard_reads_alone_is_named():
    planted = 'def _on_pull(self, meta, arrays):\n    return meta.get("hint"), "epoch" in meta, _int(meta, "tier")\n'
    assert fields_read(planted) - schema.FIELDS == {"hint", "epoch", "tier"}
