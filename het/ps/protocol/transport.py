"""Transports: how frames travel between a client and a shard. The seam is four verbs.

- :class:`ZmqTransport`: ZeroMQ over TCP. A shard binds a ROUTER socket; a client opens one
  DEALER socket per shard, so requests to different shards are in flight at once and the
  replies of one shard come back in the order it was sent the requests. Array frames go out
  and come in without copies.
- :class:`LocalTransport`: in-process, for unit tests and single-process use. A request is
  handled by the shard inside ``send``, in the caller's thread; the frames are copied as a
  wire would, so both transports run the same encode and decode.

Client channels have ``send(frames)``, ``recv(timeout_s) -> frames`` and ``close()``;
server endpoints have ``recv(timeout_s) -> (peer, frames) | None`` and ``send(peer, frames)``.

Latency: ``ZmqTransport(latency_ms=L)`` (default: the environment variable
``HET_PS_LATENCY_MS``, else 0) gives every client channel a one-way delay of ``L`` ms in each
direction, so a request-reply round trip takes at least ``2 L``. The emulated cluster network
(het.bench.netns) shapes bandwidth with tbf but cannot add delay (no netem on these kernels), so
latency is added here. See :class:`DelayedChannel` for how it keeps requests in flight at once.
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import threading
import time

import zmq

from het.ps.protocol.messages import MAX_FRAMES, MessageTooLarge, too_large

LATENCY_ENV = "HET_PS_LATENCY_MS"


def tcp_address(address: str) -> str:
    """``"host:port"`` or ``"tcp://host:port"`` -> ``"tcp://host:port"``.

    Example:
        >>> tcp_address("127.0.0.1:5555")
        'tcp://127.0.0.1:5555'
    """
    if not isinstance(address, str) or not address:
        raise ValueError(f"expected an address 'host:port', got {address!r}")
    if "://" in address:
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected an address 'host:port' (port 0 to 65535), got {address!r}")
    return f"tcp://{address}"


class ZmqChannel:
    """A client's connection to one shard (a DEALER socket)."""

    def __init__(self, context: zmq.Context, address: str, curve_server: bytes | None = None):
        self.address = tcp_address(address)
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self._timeout_ms = -1  # ZeroMQ's default: a receive waits as long as it takes
        _curve_client(self.socket, curve_server)
        self.socket.connect(self.address)

    def send(self, frames) -> None:
        self.socket.send_multipart(frames, copy=False)

    def recv(self, timeout_s: float | None):
        """The next reply's frames; TimeoutError naming the address if none comes within
        ``timeout_s`` (None: wait as long as it takes). The socket's own receive timeout waits,
        set when it changes: one call into ZeroMQ a reply, not a poll and then a receive."""
        ms = -1 if timeout_s is None else int(timeout_s * 1000)
        if ms != self._timeout_ms:
            self.socket.setsockopt(zmq.RCVTIMEO, ms)
            self._timeout_ms = ms
        try:
            return self.socket.recv_multipart(copy=False)
        except zmq.Again:
            raise TimeoutError(f"no reply from PS shard at {self.address} within {timeout_s:g} s "
                               f"(is `het serve` running there?)") from None

    def close(self) -> None:
        self.socket.close(linger=0)


class DelayedChannel:
    """A client's connection to one shard over a link with a one-way delay of ``latency_s``.

    A relay thread owns the DEALER socket; the caller talks to it over an in-process PAIR
    socket. The relay stamps each request with a due time (arrival + ``latency_s``) and sends it
    to the shard once due, and does the same for each reply on its way back. Messages wait in
    two FIFO queues (one delay for all keeps the order), so any number are in flight at once, as
    on a real link: ``send`` never blocks the caller, a prefetched sync still overlaps the
    step's compute, and requests to several shards (one channel each) are delayed in parallel,
    not one after the other. Sleeping in ``send`` would have been simpler but wrong: it would
    stall the training thread and add the delay once per shard. Frames pass through without
    copies. Bandwidth is not modelled here (tbf does that).
    """

    _names = itertools.count()

    def __init__(self, context: zmq.Context, address: str, latency_s: float, curve_server: bytes | None = None):
        if not latency_s > 0:
            raise ValueError(f"latency must be > 0 s for a delayed channel, got {latency_s!r}")
        self.address = tcp_address(address)
        self.latency_s = float(latency_s)
        dealer = context.socket(zmq.DEALER)  # made and connected here, so a bad address raises here
        dealer.setsockopt(zmq.LINGER, 0)
        _curve_client(dealer, curve_server)
        try:
            dealer.connect(self.address)
        except zmq.ZMQError:
            dealer.close()
            raise
        inproc = f"inproc://het-delay-{os.getpid()}-{next(self._names)}"
        self.socket = context.socket(zmq.PAIR)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(inproc)
        # the DEALER moves to the relay thread (Thread.start is the memory barrier ZeroMQ asks for)
        # and is used by it alone from then on
        self._relay = threading.Thread(target=self._run_relay, args=(context, dealer, inproc), daemon=True,
                                       name=f"het-delay {self.address}")
        self._relay.start()

    def send(self, frames) -> None:
        self.socket.send_multipart(frames, copy=False)

    def recv(self, timeout_s: float | None):
        """The next reply's frames, at least ``latency_s`` after it reached this machine."""
        if timeout_s is not None and not self.socket.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no reply from PS shard at {self.address} within {timeout_s:g} s "
                               f"(is `het serve` running there?)")
        return self.socket.recv_multipart(copy=False)

    def close(self) -> None:
        if self._relay.is_alive():
            self.socket.send(b"")  # the stop sentinel: a request always has a header frame
            self._relay.join(5.0)
        self.socket.close(linger=0)

    def _run_relay(self, context: zmq.Context, dealer: zmq.Socket, inproc: str) -> None:
        pair = context.socket(zmq.PAIR)
        pair.setsockopt(zmq.LINGER, 0)
        pair.connect(inproc)
        poller = zmq.Poller()
        poller.register(pair, zmq.POLLIN)
        poller.register(dealer, zmq.POLLIN)
        outgoing, incoming = collections.deque(), collections.deque()  # (due time, frames), FIFO
        try:
            while True:
                now = time.monotonic()
                for queue, sock in ((outgoing, dealer), (incoming, pair)):
                    while queue and queue[0][0] <= now:
                        sock.send_multipart(queue.popleft()[1], copy=False)
                dues = [q[0][0] for q in (outgoing, incoming) if q]
                timeout_ms = math.ceil((min(dues) - now) * 1000) if dues else None
                for sock, _ in poller.poll(timeout_ms):
                    frames = sock.recv_multipart(copy=False)
                    if sock is pair and len(frames) == 1 and len(frames[0]) == 0:
                        return  # close()
                    (outgoing if sock is pair else incoming).append((time.monotonic() + self.latency_s, frames))
        finally:
            dealer.close(linger=0)
            pair.close(linger=0)


class ZmqEndpoint:
    """A shard's listening socket (ROUTER). ``address`` is the bound address. With
    ``max_frame_bytes``, ZeroMQ drops the connection of a peer that sends a larger frame while
    it arrives, before the frame is held in memory whole (``ZMQ_MAXMSGSIZE``). A message of more
    than :data:`~het.ps.protocol.messages.MAX_FRAMES` frames, or (``max_message_bytes``) of more
    bytes, is let go frame by frame as it is read, none kept past the limit, and refused
    (:meth:`recv`). ZeroMQ hands a message over only whole: until then it holds its frames."""

    def __init__(self, context: zmq.Context, address: str, max_frame_bytes: int | None = None,
                 curve_secret: bytes | None = None, max_message_bytes: int | None = None):
        self.max_message_bytes = max_message_bytes
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 1000)
        if curve_secret is not None:  # every frame encrypted, and only CURVE clients let in
            self.socket.curve_server = True
            self.socket.curve_secretkey = curve_secret
        if max_frame_bytes is not None:
            self.socket.setsockopt(zmq.MAXMSGSIZE, int(max_frame_bytes))
        address = tcp_address(address)
        if address.endswith(":0"):
            port = self.socket.bind_to_random_port(address[:-2])
            address = f"{address[:-2]}:{port}"
        else:
            self.socket.bind(address)
        self.address = address

    def recv(self, timeout_s: float | None = None):
        """The next request, ``(peer, frames)``, or None after ``timeout_s``; MessageTooLarge
        (naming its peer and first frame) for one past the limits, read to its end and let go."""
        if timeout_s is not None and not self.socket.poll(int(timeout_s * 1000)):
            return None
        peer = self.socket.recv(copy=False)
        frames, count, size, more = [], 0, 0, peer.more
        while more:
            frame = self.socket.recv(copy=False)
            count, size, more = count + 1, size + len(frame), frame.more
            if count <= MAX_FRAMES and (self.max_message_bytes is None or size <= self.max_message_bytes):
                frames.append(frame)
            elif len(frames) > 1:
                del frames[1:]  # past the limits: only the first frame (its request id) is kept
        if count > MAX_FRAMES or (self.max_message_bytes is not None and size > self.max_message_bytes):
            raise MessageTooLarge(too_large(count, size, self.max_message_bytes), peer, frames[0] if frames else b"")
        return peer, frames

    def send(self, peer, frames) -> None:
        self.socket.send_multipart([peer, *frames], copy=False)

    def close(self) -> None:
        self.socket.close()


class ZmqTransport:
    """ZeroMQ over TCP.

    Args:
        context: the ZeroMQ context (default: the process's shared one).
        latency_ms: one-way delay of every client channel, each way (see :class:`DelayedChannel`);
            None reads the environment variable ``HET_PS_LATENCY_MS`` (unset: 0, no delay).
            Servers' endpoints are never delayed: the client's channel delays both directions.

    Example:
        >>> t = ZmqTransport()
        >>> server = t.bind("127.0.0.1:0")
        >>> client = t.connect(server.address)
        >>> client.send([b"ping"])
        >>> peer, frames = server.recv(5.0)
        >>> server.send(peer, [b"pong"])
        >>> bytes(client.recv(5.0)[0])
        b'pong'
        >>> client.close(); server.close()
    """

    def __init__(self, context: zmq.Context | None = None, latency_ms: float | None = None,
                 curve_keys: tuple[bytes, bytes] | None = None):
        self.context = context or zmq.Context.instance()
        self.latency_ms = None if latency_ms is None else check_latency(latency_ms, "latency_ms")
        self.curve_keys = curve_keys  # (public, secret) of the shards' CURVE key pair: encrypt every frame

    def bind(self, address: str, max_frame_bytes: int | None = None,
             max_message_bytes: int | None = None) -> ZmqEndpoint:
        secret = self.curve_keys[1] if self.curve_keys else None
        return ZmqEndpoint(self.context, address, max_frame_bytes, secret, max_message_bytes)

    def connect(self, address: str) -> ZmqChannel | DelayedChannel:
        latency_ms = latency_from_env() if self.latency_ms is None else self.latency_ms  # read here: servers never
        server = self.curve_keys[0] if self.curve_keys else None
        if latency_ms > 0:
            return DelayedChannel(self.context, address, latency_ms / 1000, server)
        return ZmqChannel(self.context, address, server)


def check_latency(value, what: str) -> float:
    """``value`` as a latency in ms: a finite number >= 0, else ValueError naming ``what``.

    Example:
        >>> check_latency("2.5", "HET_PS_LATENCY_MS")
        2.5
    """
    try:
        ms = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number of milliseconds >= 0, got {value!r}") from None
    if not (math.isfinite(ms) and ms >= 0):
        raise ValueError(f"{what} must be a number of milliseconds >= 0, got {value!r}")
    return ms


def latency_from_env() -> float:
    """The one-way PS latency in ms that ``HET_PS_LATENCY_MS`` asks for (0 when unset or empty)."""
    text = os.environ.get(LATENCY_ENV, "").strip()
    return check_latency(text, LATENCY_ENV) if text else 0.0


class LocalChannel:
    """A client's connection to an in-process shard: ``send`` runs the request."""

    def __init__(self, shard, address: str):
        self.shard = shard
        self.address = address
        self.replies = collections.deque()

    def send(self, frames) -> None:
        wire = [bytearray(memoryview(f)) for f in frames]  # copied, as a wire would
        self.replies.append([bytearray(memoryview(f)) for f in self.shard.handle_frames(wire)])

    def recv(self, timeout_s: float):
        if not self.replies:
            raise TimeoutError(f"no reply pending from in-process shard {self.address}")
        return self.replies.popleft()

    def close(self) -> None:
        self.replies.clear()


class LocalTransport:
    """In-process transport: shards are registered by name and run in the caller's thread."""

    def __init__(self):
        self.shards = {}

    def bind(self, address: str, shard) -> str:
        self.shards[address] = shard
        return address

    def connect(self, address: str) -> LocalChannel:
        if address not in self.shards:
            raise ValueError(f"no in-process shard named {address!r}; known: {sorted(self.shards)}")
        return LocalChannel(self.shards[address], address)


def _curve_client(socket, server_public: bytes | None) -> None:
    """Make ``socket`` a CURVE client of the shard whose public key is ``server_public`` (an
    ephemeral key pair of its own), before it connects; nothing without a key."""
    if server_public is not None:
        socket.curve_publickey, socket.curve_secretkey = zmq.curve_keypair()
        socket.curve_serverkey = server_public
