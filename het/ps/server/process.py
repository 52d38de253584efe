"""A shard in a child process (``het serve``) and its supervisor (``het serve --supervise``):
what starts shards, kept apart from the serve loop so that a launcher loads neither the store
nor torch."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading

from het.config import ShardConfig
from het.process import parent_env
from het.ps.protocol.auth import SECRET_ENV, check_bind, check_secret
from het.ps.server.store import saves


@dataclasses.dataclass(frozen=True)
class JobShard:
    """Shard ``index`` of ``num_shards`` of a training job, named by the job's config
    (``TrainConfig.to_dict()``): the shard makes the job's tables and settings itself
    (``het serve --job-shard``), so a launcher needs neither torch nor the data to start it."""

    job: dict
    index: int
    num_shards: int


class ServerProcess:
    """A shard in a child process (``het serve``), on a free port of 127.0.0.1 by default.

    ``cfg`` is the shard's config, or a :class:`JobShard` the child makes it from. The
    child's output goes to ``log_path`` when given; ``env`` adds environment variables;
    ``new_session`` keeps Ctrl-C of the terminal from reaching it; ``popen`` starts it (e.g. inside
    a network namespace, :meth:`het.bench.netns.EmulatedNetwork.popen`). It gets SIGTERM if this
    process dies. ``stop()`` asks it to end (SIGTERM), then kills it if it has not ended within
    ``grace_s``. A ``secret`` reaches the child in its
    environment (``HET_SECRET``), not on its command line, where ``ps`` would show it; without
    one, the child does not inherit this process's ``HET_SECRET`` either. ``state_dir`` is the
    shard's state directory (default: a temporary one, removed at stop); ``wal`` gives the shard
    a write-ahead log there (``wal_recover_prefix``: ``het serve --wal-recover-prefix``);
    ``metrics_port`` serves its Prometheus metrics (``het serve --metrics-port``) at
    ``metrics_url``. ``wait``: return once it listens (else see :meth:`wait_started`).
    """

    def __init__(self, cfg: ShardConfig | JobShard, bind: str = "127.0.0.1:0", secret: bytes | None = None,
                 log_path: str | None = None, start_timeout_s: float = 60.0, env: dict | None = None,
                 new_session: bool = False, popen=subprocess.Popen, state_dir: str | None = None,
                 wal: bool = False, encrypt: bool = False, wal_recover_prefix: bool = False,
                 metrics_port: int | None = None, wait: bool = True):
        secret = check_secret(secret)
        check_bind(bind, secret)
        self._own_state = state_dir is None
        self.state_dir = saves.temporary() if state_dir is None else state_dir
        spec = (["--job-shard", json.dumps(dataclasses.asdict(cfg))] if isinstance(cfg, JobShard) else
                ["--shard-config", json.dumps(_cfg_dict(cfg))])
        cmd = [sys.executable, "-m", "het", "serve", "--bind", bind, *spec,
               "--state-dir", self.state_dir, *(["--wal"] if wal else []), *(["--encrypt"] if encrypt else []),
               *(["--wal-recover-prefix"] if wal_recover_prefix else []),
               *(["--metrics-port", str(metrics_port)] if metrics_port is not None else [])]
        self.log_path = log_path
        self._log = open(log_path, "w") if log_path else None
        self.proc = popen(cmd, stdout=subprocess.PIPE, stderr=self._log or subprocess.DEVNULL,
                                     text=True, env=parent_env(dict(_child_env(secret), **(env or {}))),
                                     start_new_session=new_session)
        self.metrics_url = self.address = None
        self._start = (start_timeout_s, metrics_port is not None)
        if wait:
            self.wait_started()

    def wait_started(self) -> str:
        """The shard's address, once it listens (``wait=False``: the caller goes on meanwhile,
        e.g. to start the workers on the port it chose). Raises RuntimeError, naming its log,
        when it does not start."""
        if self.address is None:
            self.address = self._read_address(*self._start)
        return self.address

    def _read_address(self, timeout_s: float, metrics: bool) -> str:
        timer = threading.Timer(timeout_s, self.proc.kill)
        timer.start()
        try:
            line = self.proc.stdout.readline()
            while metrics and self.metrics_url is None:  # its line follows the address's
                said = self.proc.stdout.readline()
                if not said:
                    break
                if said.startswith("het serve: metrics at "):
                    self.metrics_url = said.rsplit(" ", 1)[1].strip()
        finally:
            timer.cancel()
        if " listening on " not in line or (metrics and self.metrics_url is None):
            self.stop()
            raise RuntimeError(f"PS shard did not start (exit code {self.proc.poll()}); "
                               f"log: {self.log_path or 'not kept'}")
        threading.Thread(target=self._drain, daemon=True).start()
        return line.rsplit(" ", 1)[1].strip()

    def _drain(self) -> None:
        for line in self.proc.stdout:
            if self._log:
                self._log.write(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log:
            self._log.close()
        if self._own_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _child_env(secret: bytes | None) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop(SECRET_ENV, None)
    if secret is not None:
        env[SECRET_ENV] = os.fsdecode(secret)  # the child's os.fsencode gives back the same bytes
    return env


def _cfg_dict(cfg: ShardConfig) -> dict:
    """Every field of ``cfg`` as JSON takes it (:meth:`ShardConfig.from_dict` reads it back)."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)} | {"tables": [t.to_dict() for t in cfg.tables]}


def supervise(argv: list[str], bind: str, restarts: int | None, backoff_s: float = 1.0) -> int:
    """``het serve --supervise``: run ``het serve ARGV --bind BIND`` as a child and start it
    again on the same address (the port it got, when ``bind`` asked for any) whenever it dies
    of anything but a clean stop, up to ``restarts`` times (None: always). With ``--wal`` on the
    same state directory, a restarted shard has every push it acknowledged and its clients
    re-send the rest. A shard that ends before it ever listened (a flag it refuses, its port
    taken) is not started again: that would fail the same way. SIGTERM and SIGINT reach the
    shard, which stops cleanly, and end the supervisor; the shard dies with it. The child's
    exit code at the end."""
    stopping = threading.Event()
    child: list[subprocess.Popen] = []

    def forward(signum, frame):
        stopping.set()
        if child and child[0].poll() is None:
            child[0].send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    done = 0
    while True:
        proc = subprocess.Popen([sys.executable, "-m", "het", "serve", *argv, "--bind", bind], stdout=subprocess.PIPE,
                                text=True, env=parent_env())
        child[:] = [proc]
        if stopping.is_set() and proc.poll() is None:  # a signal that came while it started
            proc.send_signal(signal.SIGTERM)
        listened = False
        for line in proc.stdout:  # the shard's lines, passed on; its address fixes the port for restarts
            print(line, end="", flush=True)
            if " listening on " in line:
                bind, listened = line.rsplit(" ", 1)[1].strip().removeprefix("tcp://"), True
        code = proc.wait()
        if stopping.is_set() or code == 0 or not listened or (restarts is not None and done >= restarts):
            return code
        done += 1
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        print(f"het serve: the shard {how}; restarting it on {bind} (restart {done}"
              f"{'' if restarts is None else f' of {restarts}'})", flush=True)
        stopping.wait(backoff_s)
        if stopping.is_set():
            return code
