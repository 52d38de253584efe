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
"""

from __future__ import annotations

import collections

import zmq


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
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected an address 'host:port', got {address!r}")
    return f"tcp://{address}"


class ZmqChannel:
    """A client's connection to one shard (a DEALER socket)."""

    def __init__(self, context: zmq.Context, address: str):
        self.address = tcp_address(address)
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(self.address)

    def send(self, frames) -> None:
        self.socket.send_multipart(frames, copy=False)

    def recv(self, timeout_s: float | None):
        """The next reply's frames; TimeoutError naming the address if none comes within
        ``timeout_s`` (None: wait as long as it takes)."""
        if timeout_s is not None and not self.socket.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no reply from PS shard at {self.address} within {timeout_s:g} s "
                               f"(is `het serve` running there?)")
        return self.socket.recv_multipart(copy=False)

    def close(self) -> None:
        self.socket.close(linger=0)


class ZmqEndpoint:
    """A shard's listening socket (ROUTER). ``address`` is the bound address."""

    def __init__(self, context: zmq.Context, address: str):
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 1000)
        address = tcp_address(address)
        if address.endswith(":0"):
            port = self.socket.bind_to_random_port(address[:-2])
            address = f"{address[:-2]}:{port}"
        else:
            self.socket.bind(address)
        self.address = address

    def recv(self, timeout_s: float | None = None):
        if timeout_s is not None and not self.socket.poll(int(timeout_s * 1000)):
            return None
        peer, *frames = self.socket.recv_multipart(copy=False)
        return peer, frames

    def send(self, peer, frames) -> None:
        self.socket.send_multipart([peer, *frames], copy=False)

    def close(self) -> None:
        self.socket.close()


class ZmqTransport:
    """ZeroMQ over TCP.

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

    def __init__(self, context: zmq.Context | None = None):
        self.context = context or zmq.Context.instance()

    def bind(self, address: str) -> ZmqEndpoint:
        return ZmqEndpoint(self.context, address)

    def connect(self, address: str) -> ZmqChannel:
        return ZmqChannel(self.context, address)


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
