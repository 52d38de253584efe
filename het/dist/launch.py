"""A whole local cluster: S shard processes and W worker processes (``het train --ps``) on this
machine, watched until the job ends and torn down on exit, on Ctrl-C and when any of them dies.

Workers get torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
so the worker code is the same here and under torchrun on real machines. Every child is in its
own session (Ctrl-C reaches only this launcher, which then stops the workers first, so they
flush their caches, and the shards last) and gets SIGTERM if the launcher itself dies
(PR_SET_PDEATHSIG): no orphans.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from het.config import ShardConfig, TableConfig
from het.process import parent_env
from het.ps.server.process import JobShard, ServerProcess


class ClusterError(RuntimeError):
    """A process of the local cluster failed; the message names its role and its log."""


@dataclass
class Role:
    name: str
    proc: subprocess.Popen
    log: str


SHARD_PORT = 29700  # shard i's port inside an emulated network's namespaces: SHARD_PORT + i


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def threads_per_process(processes: int, cores: int | None = None) -> int:
    """Threads each of ``processes`` processes on one machine gets (``OMP_NUM_THREADS`` if set):
    the cores split evenly, or their thread pools spin against each other (measured here: 18x
    slower with 2 threads each on 2 cores)."""
    if "OMP_NUM_THREADS" in os.environ:
        return int(os.environ["OMP_NUM_THREADS"])
    return max(1, (cores or os.cpu_count() or 1) // processes)


class LocalCluster:
    """Start, watch and stop the processes of one local training job: ``servers`` shards of
    ``tables``, and ``workers`` ranks of ``het train --ps ADDRESSES WORKER_ARGS...``. ``tables``
    may be a job's config instead (``TrainConfig.to_dict()``): each shard then makes the job's
    tables itself (:class:`het.ps.server.process.JobShard`), and this process needs neither
    torch nor the data."""

    def __init__(self, tables: list[TableConfig] | dict, workers: int, servers: int, worker_args: list[str], log_dir: str,
                 secret: bytes | None = None, progress: bool = True, network=None, wal: bool = False,
                 encrypt: bool = False, on_failure=None, shard_options: dict | None = None,
                 metrics_port: int | None = None, max_worker_restarts: int = 0):
        """``network``: an open :class:`het.bench.netns.EmulatedNetwork` with hosts ``ps<i>`` and
        ``worker<r>``; every process then runs in its own host's namespace (binding a shard
        there needs ``secret``). ``wal``: the shards keep a write-ahead log in their state
        directories (``LOG_DIR/ps-<i>``). ``on_failure``: called with the :class:`ClusterError`
        as soon as a process's death is seen, before the teardown (which waits for the others).
        ``shard_options``: more :class:`het.config.ShardConfig` fields (``memory``...) for
        ``tables`` given as tables (a job's shards take the job's).
        ``metrics_port``: shard ``i`` serves its Prometheus metrics on port ``metrics_port + i``
        (0: free ports), kept when it is restarted; their addresses are printed.
        ``max_worker_restarts``: when a worker dies, the workers are started again, as torchrun's
        agent does (het.train.rejoin), while the shards serve on, up to this many times."""
        self._tables, self.num_workers, self.num_servers, self.wal = tables, workers, servers, wal
        self.encrypt, self.shard_options = encrypt, dict(shard_options or {})
        self.worker_args, self.log_dir, self.secret, self.progress = list(worker_args), log_dir, secret, progress
        self.network, self.on_failure, self.metrics_port = network, on_failure, metrics_port
        self.shard_restarts, self.max_worker_restarts, self.worker_restarts = 0, max_worker_restarts, 0
        self.servers: list[ServerProcess] = []
        self.workers: list[Role] = []
        os.makedirs(log_dir, exist_ok=True)
        threads = threads_per_process(workers + servers)
        self.threads_env = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": str(threads)}

    def _shard(self, i: int) -> ShardConfig | JobShard:
        """What shard ``i`` holds: its config, or the job's that it makes it from."""
        if isinstance(self._tables, dict):
            return JobShard(self._tables, i, self.num_servers)
        return ShardConfig(tuple(self._tables), i, self.num_servers, **self.shard_options)

    def run(self) -> dict:
        """Run the job to the end; the summary of rank 0. Raises ClusterError if a process fails."""
        failed = False
        try:
            # The workers first, then the shards (a start is an interpreter's and torch's, seconds,
            # and the tables may need this process to load torch): each shard on a port chosen
            # here, which the workers are given.
            binds = [f"{self._ip(f'ps{i}')}:{free_port() if self.network is None else SHARD_PORT + i}"
                     for i in range(self.num_servers)]
            summary_path = os.path.join(self.log_dir, "summary.json")
            if os.path.exists(summary_path):
                os.remove(summary_path)
            self._start_workers(summary_path, [f"tcp://{b}" for b in binds])
            for i, bind in enumerate(binds):
                self.servers.append(ServerProcess(self._shard(i),
                                                  bind=bind, secret=self.secret, env=self.threads_env, new_session=True,
                                                  log_path=os.path.join(self.log_dir, f"server-{i}.log"),
                                                  popen=self._popen(f"ps{i}"),
                                                  state_dir=os.path.join(self.log_dir, f"ps-{i}"), wal=self.wal,
                                                  encrypt=self.encrypt, metrics_port=self._metrics_port(i), wait=False))
            self._write_pids()
            for i, server in enumerate(self.servers):
                server.wait_started()
                if server.metrics_url:
                    print(f"het train: PS shard {i}'s metrics at {server.metrics_url}", file=sys.stderr, flush=True)
            try:
                self._watch(summary_path)
            except ClusterError as e:
                failed = True
                e.worker_restarts = self.worker_restarts
                if self.on_failure is not None:
                    self.on_failure(e)
                raise
            with open(summary_path) as f:
                return {**json.load(f), "shard_restarts": self.shard_restarts}
        finally:
            self.stop(at_once=failed)

    def _ip(self, host: str) -> str:
        return self.network.address(host) if self.network is not None else "127.0.0.1"

    def _popen(self, host: str):
        return functools.partial(self.network.popen, host) if self.network is not None else subprocess.Popen

    def _start_workers(self, summary_path: str, addresses: list[str] | None = None) -> None:
        """Every worker, as the generation ``worker_restarts`` of the group (torchrun's
        environment: its restart count and the most restarts allowed), and ``pids.json``.
        ``addresses``: the shards' (default: where they listen)."""
        addresses = addresses or [s.address for s in self.servers]
        # worker0's namespace is empty; a port per generation: the old store may linger a moment
        port = free_port() if self.network is None else 29500 + self.worker_restarts
        for rank in range(self.num_workers):
            env = dict(os.environ, **self.threads_env, RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE=str(self.num_workers), MASTER_ADDR=self._ip("worker0"), MASTER_PORT=str(port),
                       PYTHONUNBUFFERED="1", TORCHELASTIC_RESTART_COUNT=str(self.worker_restarts),
                       TORCHELASTIC_MAX_RESTARTS=str(self.max_worker_restarts), TORCHELASTIC_RUN_ID="local")
            if self.network is not None:
                env["GLOO_SOCKET_IFNAME"] = "eth0"  # advertise the namespace's link, not the hostname's 127.0.0.1
            if self.secret:
                env["HET_SECRET"] = os.fsdecode(self.secret)
            cmd = [sys.executable, "-m", "het", "train", "--ps", ",".join(addresses), *self.worker_args]
            if rank == 0:
                cmd += ["--summary", summary_path]
            again = f".rejoin-{self.worker_restarts}" if self.worker_restarts else ""
            log = os.path.join(self.log_dir, f"worker-{rank}{again}.log")
            open(log, "w").close()
            out = open(log, "a")  # appended to by the child's stdout and by the tee of its stderr
            tee = rank == 0 and self.progress
            proc = self._popen(f"worker{rank}")(cmd, env=parent_env(env), stdout=out,
                                                stderr=subprocess.PIPE if tee else out, start_new_session=True)
            out.close()
            if tee:  # rank 0's progress bar reaches the terminal and its log
                threading.Thread(target=_tee, args=(proc.stderr, log), daemon=True).start()
            self.workers.append(Role(f"worker {rank}", proc, log))
        self._write_pids()

    def _write_pids(self) -> None:
        with open(os.path.join(self.log_dir, "pids.json"), "w") as f:
            json.dump({w.name: w.proc.pid for w in self.workers}
                      | {f"PS shard {i}": s.proc.pid for i, s in enumerate(self.servers)}, f)

    def _watch(self, summary_path: str, poll_s: float = 0.2) -> None:
        while True:
            # shards first: a worker that failed because a shard died is not a worker to restart
            for role in [Role(f"PS shard {i}", s.proc, s.log_path) for i, s in enumerate(self.servers)] + self.workers:
                code = role.proc.poll()
                if code not in (None, 0) and role.name.startswith("PS") and self.wal:
                    self._restart_shard(int(role.name.rsplit(" ", 1)[1]), code)  # its log holds every push
                elif code not in (None, 0) and role in self.workers and self.worker_restarts < self.max_worker_restarts:
                    self._rejoin(role, code, summary_path)
                    break
                elif code not in (None, 0) or (code == 0 and role.name.startswith("PS")):
                    how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
                    said = last_line(role.log) if code > 0 else ""  # a refusal says why last; a kill, nothing
                    raise ClusterError(f"{role.name} (pid {role.proc.pid}) {how}{': ' + said if said else ''}; "
                                       f"stopping the job. Its log: {role.log}")
            if all(w.proc.poll() == 0 for w in self.workers):
                return
            time.sleep(poll_s)

    def _rejoin(self, dead: Role, code: int, summary_path: str, grace_s: float = 60.0) -> None:
        """A worker died: the others, their collectives broken, flush their caches and leave
        (het.train.rejoin); then the group starts again, the shards untouched."""
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        print(f"het train: {dead.name} (pid {dead.proc.pid}) {how}; the workers re-form while the shards serve on "
              f"(worker restart {self.worker_restarts + 1} of {self.max_worker_restarts}). Its log: {dead.log}",
              file=sys.stderr, flush=True)
        deadline = time.monotonic() + grace_s
        for w in self.workers:
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # not in a collective: asked to stop, as torchrun's agent does
                w.proc.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.proc.wait(15)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        for i, s in enumerate(self.servers):
            if not s.alive() and not self.wal:  # the workers died of it: the job stops (and restarts)
                code = s.proc.poll()
                raise ClusterError(f"PS shard {i} (pid {s.proc.pid}) exited with code {code}; stopping the job. "
                                   f"Its log: {s.log_path}")
        self.worker_restarts += 1
        self.workers = []
        self._start_workers(summary_path)

    def _restart_shard(self, i: int, code: int) -> None:
        """Start shard ``i`` again on its address and state directory: it recovers its last save
        and its write-ahead log, and the workers, which probe a silent shard, re-send to it what
        it had not answered."""
        old = self.servers[i]
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        print(f"het train: PS shard {i} (pid {old.proc.pid}) {how}; restarting it on {old.address} from its "
              f"write-ahead log. Its log: {old.log_path}", file=sys.stderr, flush=True)
        old.stop()
        host, bind = f"ps{i}", old.address.replace("tcp://", "")
        self.servers[i] = ServerProcess(self._shard(i), bind=bind, secret=self.secret,
                                        env=self.threads_env, new_session=True, popen=self._popen(host),
                                        log_path=os.path.join(self.log_dir, f"server-{i}.restart-{self.shard_restarts}.log"),
                                        state_dir=os.path.join(self.log_dir, f"ps-{i}"), wal=True,
                                        encrypt=self.encrypt, metrics_port=_port_of(old.metrics_url))
        self.shard_restarts += 1

    def _metrics_port(self, i: int) -> int | None:
        if self.metrics_port is None:
            return None
        return self.metrics_port + i if self.metrics_port else 0

    def stop(self, grace_s: float = 15.0, at_once: bool = False) -> None:
        """Workers first (SIGTERM: they flush and exit), then the shards; SIGKILL after grace_s.
        ``at_once``: the shards get SIGTERM with the workers, for a job that failed: the job is
        lost, so there is nothing to flush for, and their exits overlap."""
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for s in self.servers if at_once else ():
            if s.alive():
                s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for w in self.workers:
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        for s in self.servers:
            s.stop(grace_s)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers] + [s.proc.pid for s in self.servers]


def last_line(path: str | None, most: int = 300) -> str:
    """The last line a process wrote to its log (what a refusal says), at most ``most``
    characters; empty when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    except (OSError, TypeError):
        return ""
    return lines[-1][:most] if lines else ""


def _tee(stream, log_path: str) -> None:
    with open(log_path, "ab", buffering=0) as log:
        for chunk in iter(lambda: stream.read1(4096), b""):
            log.write(chunk)
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()


def _port_of(url: str | None) -> int | None:
    """The port of ``http://HOST:PORT/metrics`` (None: no URL)."""
    return None if url is None else int(url.rsplit(":", 1)[1].split("/", 1)[0])
