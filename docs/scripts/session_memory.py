"""What client sessions cost a shard, and what forgetting them gives back: open N sessions on a
shard process (each one signed push, as a worker's first), wait until the idle ones are forgotten,
and print the shard's RSS at the start, with the sessions held, and after.
Run from the repository root: `.venv/bin/python docs/scripts/session_memory.py 200000`."""
import sys
import time

import numpy as np
import zmq

from het import PSClient, ServerProcess, ShardConfig, TableConfig
from het.ps.protocol.messages import Message, Op, decode, encode

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
SECRET = b"correct horse battery staple"

cfg = ShardConfig((TableConfig("t", rows=64, dim=4),), session_idle_s=20)
with ServerProcess(cfg, secret=SECRET) as server:
    watcher = PSClient.connect([server.address], secret=SECRET)
    start = watcher.stats()[0]
    nonce = watcher.link.nonces[0]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address)
    push = [np.array([1]), np.ones((1, 4), np.float32), np.array([1])]
    began = time.time()
    for batch in range(N // 100):  # 100 requests in flight at a time
        for i in range(batch * 100, batch * 100 + 100):
            meta = {"table": "t", "nonce": nonce, "session": f"{i:032x}", "seq": 1}
            sock.send_multipart(encode(Message(Op.PUSH, i + 1, meta, push), SECRET))
        for _ in range(100):
            assert decode(sock.recv_multipart(), SECRET, what="reply").status == 0
    opened = time.time() - began
    watcher = PSClient.connect([server.address], secret=SECRET)  # the first may have been idle too long
    held = watcher.stats()[0]
    while (now := watcher.stats()[0])["sessions"] > 1:
        time.sleep(0.5)
    mib = 1 << 20
    print(f"{N} sessions opened in {opened:.1f} s; shard RSS {start['rss_bytes'] / mib:.1f} MiB at the start, "
          f"{held['rss_bytes'] / mib:.1f} with {held['sessions']} sessions held, {now['rss_bytes'] / mib:.1f} once "
          f"forgotten ({now['sessions_forgotten']} forgotten)")
