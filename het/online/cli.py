"""``het serve-model``: an export served over HTTP (:mod:`het.online.app`), micro-batched, and
kept fresh from a training job's publications (``--follow DIR``)."""

from __future__ import annotations

import argparse
import os

TOKEN_ENV = "HET_SERVE_TOKEN"


def add_parser(sub) -> None:
    """Register ``het serve-model`` on the ``het`` command's subparsers."""
    p = sub.add_parser("serve-model", help="serve an export over HTTP (FastAPI): predictions, health, Prometheus "
                                           "metrics; --follow a training job's updates",
                       description="Serve the export OUT: POST /v1/predict {\"instances\": [{column: value}, ...]} "
                                   "-> {\"predictions\": [...], \"version\": N}; GET /healthz; GET /metrics. "
                                   "Concurrent requests are scored together (micro-batching). With --follow DIR the "
                                   "server starts from DIR's newest base and applies each delta het train --publish "
                                   "DIR writes there.")
    p.add_argument("export", nargs="?", default=None, help="an export directory (default with --follow: DIR's newest base)")
    p.add_argument("--bind", default="127.0.0.1:8080", help="HOST:PORT (default: %(default)s; port 0: any free one)")
    p.add_argument("--follow", default=None, help="the directory het train --publish writes: follow its updates")
    p.add_argument("--poll-s", type=float, default=0.5, help="with --follow: seconds between looks (default: %(default)s)")
    p.add_argument("--token-file", default=None, help=f"a file holding the token requests must carry (Authorization: "
                                                      f"Bearer TOKEN); or ${TOKEN_ENV}. Needed to bind beyond loopback")
    p.add_argument("--no-batching", dest="batching", action="store_false", help="score each request alone")
    p.add_argument("--max-batch", type=int, default=512, help="rows a batch holds at most (default: %(default)s)")
    p.add_argument("--max-wait-ms", type=float, default=0.0,
                   help="how long a request that finds the scorer idle waits for others to share its batch; "
                        "requests arriving while a batch is scored always go together in the next "
                        "(default: %(default)s)")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20, help="larger bodies get 413 (default: %(default)s)")
    p.add_argument("--max-instances", type=int, default=4096, help="more instances get 413 (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads scoring (default: %(default)s)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> None:
    import socket

    import torch
    import uvicorn

    from het.online.app import Limits, Metrics, make_app
    from het.online.follow import Follower, newest_base
    from het.online.live import Live, first_version
    from het.online.scorer import Scorer
    from het.ps.protocol.auth import is_loopback

    host, _, port = args.bind.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--bind: expected HOST:PORT, got {args.bind!r}")
    token = _token(args.token_file)
    if token is None and not is_loopback(args.bind):
        raise ValueError(f"binding {args.bind!r} would serve the model beyond this machine without a token: give "
                         f"--token-file PATH (or ${TOKEN_ENV}), or bind 127.0.0.1")
    for name in ("max_batch", "max_body_bytes", "max_instances", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_wait_ms < 0 or args.poll_s <= 0:
        raise ValueError(f"--max-wait-ms must be >= 0 and --poll-s > 0, got {args.max_wait_ms}, {args.poll_s}")
    torch.set_num_threads(args.threads)
    if args.export is None and args.follow is None:
        raise ValueError("give an export directory, or --follow DIR (then DIR's newest base is served)")
    if args.export is not None:
        from het.export import load_model

        live = Live(first_version(load_model(args.export)))
    else:
        live = Live(newest_base(args.follow))
    metrics = Metrics(live)
    scorer = Scorer(live, args.batching, args.max_batch, args.max_wait_ms / 1000, on_batch=metrics.batch_rows.observe)
    app = make_app(live, scorer, metrics, token, Limits(args.max_body_bytes, args.max_instances))
    follower = Follower(live, args.follow, args.poll_s, metrics).start() if args.follow else None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so, and without it a kept-alive
    # connection's answers wait on delayed ACKs (40 ms each, measured)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), int(port)))
    sock.listen(2048)  # from here connections wait for the server: the line below may be acted on at once
    bound = sock.getsockname()[1]
    print(f"het serve-model: serving {live.current.model.manifest['model']['name']} version {live.current.number} "
          f"on http://{host}:{bound}{' (following ' + args.follow + ')' if args.follow else ''}", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        if follower is not None:
            follower.stop()
        scorer.close()


def _token(path: str | None) -> bytes | None:
    if path is not None:
        with open(path, "rb") as f:
            token = f.read().strip()
        if not token:
            raise ValueError(f"{path}: the token file is empty")
        return token
    value = os.environ.get(TOKEN_ENV)
    return value.encode() if value else None
