"""Shared-secret authentication for the PS: where a secret comes from, the MAC, freshness,
encryption, where to bind.

A shard binds 127.0.0.1 unless told otherwise; bound to any other address it must hold a shared
secret (:func:`check_bind`). Every request it serves then carries an HMAC-SHA256 of its frames
under that secret, and so does every reply (:mod:`het.ps.protocol.messages` adds and checks the MAC
frame). The secret comes from a file (``het serve --secret-file PATH``) or, when no file is
given, from the environment variable ``HET_SECRET``; workers and shards must use the same one.
:class:`het.ps.server.process.ServerProcess` hands it to its child in the environment, never on the
command line.

The MAC (:func:`mac`) covers the header frame and every array frame, each preceded by its
length (u64), read in place. It travels as the last frame, and the header has flag ``SIGNED``
(0x01); unsigned messages are unchanged, so the protocol version is still 1. A shard with a
secret answers a request not signed with it by an unsigned error reply (``AuthError: request
is not signed ...`` or ``bad signature ...``), counts it in ``stats["unauthenticated"]`` and
keeps serving. ``PSClient.connect(..., secret=...)`` signs its requests and raises AuthError on
a reply not signed with its secret.

Freshness (:class:`het.ps.protocol.checks.Freshness`): every request but INFO names the shard's ``nonce`` (random per
shard process, learnt from INFO, which changes nothing), the client's ``session`` (random, 16 to
64 characters) and ``seq``, which grows with every request of the session to that shard; all
three are in the meta, under the MAC. A request naming another nonce was meant for an earlier
run of the shard (or replays one): it is refused with StaleError (``stats["stale"]``), and a
client with ``reconnect_s`` learns the new nonce and sends it again. With a secret, a request
without session and seq, or whose seq is not past its session's last, is refused as a replay
(``stats["replays"]``). Both refusals come before anything is read and change nothing. Apart
from these checks, a push whose seq is not past the last push applied for its session is not
applied again (``stats["pushes_again"]``): a re-sent push counts once.

Secrecy is opt-in: with ``het serve --encrypt`` (``het train --ps-encrypt``) every frame travels
under ZeroMQ's CURVE. The shards' key pair derives from the shared secret (:func:`curve_keys`),
so no other key needs handing out; clients use ephemeral key pairs.

A reply names its request's id, under the MAC; a client's ids start at a random number per
session and it takes only the reply to a request it is waiting on
(:class:`het.ps.client.connection.Connection`), so a reply recorded from another session or an
earlier run is dropped, not believed.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os

SECRET_ENV = "HET_SECRET"
MAC_SIZE = 32  # bytes of an HMAC-SHA256
_LOCAL_SCHEMES = ("ipc://", "inproc://")  # not reachable from other machines


def load_secret(path: str | None) -> bytes | None:
    """The shared secret: the bytes of the file at ``path`` (trailing newlines dropped), else
    the environment variable ``HET_SECRET``, else None. An empty secret is a ValueError.

    Example:
        >>> import os, tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix=".secret", delete=False) as f:
        ...     _ = f.write("s3cret\\n")
        >>> load_secret(f.name)
        b's3cret'
        >>> os.remove(f.name)
    """
    if path is not None:
        try:
            with open(path, "rb") as f:
                secret = f.read().rstrip(b"\r\n")
        except OSError as e:
            raise ValueError(f"cannot read the secret file {path!r}: {e.strerror}") from None
        where = f"the secret file {path!r}"
    elif SECRET_ENV in os.environ:
        secret = os.fsencode(os.environ[SECRET_ENV])  # the exact bytes, even if not UTF-8
        where = f"the environment variable {SECRET_ENV}"
    else:
        return None
    if not secret:
        raise ValueError(f"{where} holds an empty secret: expected at least one byte")
    return secret


def check_secret(secret) -> bytes | None:
    """``secret`` if it is None or non-empty bytes; TypeError or ValueError otherwise.

    Example:
        >>> check_secret(bytearray(b"k")), check_secret(None)
        (b'k', None)
        >>> check_secret("k")
        Traceback (most recent call last):
        ...
        TypeError: a shared secret must be bytes, got str
    """
    if secret is None:
        return None
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError(f"a shared secret must be bytes, got {type(secret).__name__}")
    if not secret:
        raise ValueError("a shared secret must not be empty: expected at least one byte")
    return bytes(secret)


def is_loopback(address: str) -> bool:
    """Whether ``address`` (``host:port`` or a ZeroMQ endpoint) is reachable only from this machine.

    Example:
        >>> is_loopback("127.0.0.1:5555"), is_loopback("tcp://[::1]:0"), is_loopback("0.0.0.0:5555")
        (True, True, False)
    """
    if address.startswith(_LOCAL_SCHEMES):
        return True
    rest = address[len("tcp://"):] if address.startswith("tcp://") else address
    if "://" in rest:
        return False
    host = rest.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # "*", an interface name or a host name: may face the network
        return False


def check_bind(address: str, secret: bytes | None) -> None:
    """Refuse to bind a shard beyond loopback without a shared secret (ValueError).

    Example:
        >>> check_bind("127.0.0.1:0", None)
        >>> check_bind("0.0.0.0:5555", None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: binding '0.0.0.0:5555' would serve the shard beyond this machine ... or bind 127.0.0.1
    """
    if secret is None and not is_loopback(address):
        raise ValueError(f"binding {address!r} would serve the shard beyond this machine without "
                         f"authentication: give a shared secret with --secret-file PATH or the "
                         f"environment variable {SECRET_ENV}, or bind 127.0.0.1")


def mac(secret: bytes, buffers) -> bytes:
    """HMAC-SHA256 of ``buffers`` (bytes-like: frames, C-contiguous arrays), read in place.

    Each buffer is preceded by its length (u64 little-endian), so the same bytes split into
    frames differently give a different MAC.

    Example:
        >>> a = mac(b"k", [b"ab", b"c"])
        >>> len(a), a == mac(b"k", [b"a", b"bc"]), a == mac(b"k", [b"ab", b"c"])
        (32, False, True)
    """
    h = hmac.new(secret, digestmod=hashlib.sha256)
    for buf in buffers:
        view = memoryview(buf)  # no copy, even of a (n, D) array
        h.update(view.nbytes.to_bytes(8, "little"))
        h.update(view)
    return h.digest()


def curve_keys(secret: bytes) -> tuple[bytes, bytes]:
    """The shards' CURVE key pair ``(public, secret)``, Z85 text, derived from the shared secret:
    whoever holds the secret can encrypt to a shard and no other key needs handing out.

    Example:
        >>> public, private = curve_keys(b"s3cret")
        >>> len(public), curve_keys(b"s3cret")[0] == public, curve_keys(b"other")[0] == public
        (40, True, False)
    """
    import zmq
    from zmq.utils import z85

    seed = hmac.new(check_secret(secret), b"het curve server key, v1", hashlib.sha256).digest()
    private = z85.encode(seed)
    return zmq.curve_public(private), private
