"""Which native push the shard runs for the default job's pushes: each push's kind (``sgd``,
``adagrad``, ``adagrad_steps``: a push carrying a cached row's several steps with their squares,
``adam``), counted in the shard process while ``het train --steps N`` runs, with how many rows
each kind moved:

    .venv/bin/python docs/scripts/push_kinds.py [--steps 300]

Every process of the job loads a ``sitecustomize`` from a temporary directory that wraps
:func:`het.ps.server.store.kernels.native_push_args` to append each push's kind and rows to a file.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

HOOK = '''
import os
import het.ps.server.store.kernels as kernels

_args = kernels.native_push_args


def _counted(opt, local, grads, counts, step, sq):
    kind, args = _args(opt, local, grads, counts, step, sq)
    with open(os.environ["HET_PUSH_KINDS"], "a") as f:
        f.write(f"{kind} {len(args[0])}\\n")
    return kind, args


kernels.native_push_args = _counted
'''


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "sitecustomize.py"), "w") as f:
            f.write(HOOK)
        log = os.path.join(tmp, "kinds")
        env = {**os.environ, "HET_PUSH_KINDS": log,
               "PYTHONPATH": os.pathsep.join([tmp, os.getcwd(), os.environ.get("PYTHONPATH", "")])}
        subprocess.run([sys.executable, "-m", "het", "train", "--steps", str(args.steps), "--quiet", "--json",
                        "--log-dir", os.path.join(tmp, "logs")], env=env, check=True, stdout=subprocess.DEVNULL)
        pushes, rows = collections.Counter(), collections.Counter()
        with open(log) as f:
            for line in f:
                kind, n = line.split()
                pushes[kind] += 1
                rows[kind] += int(n)
    print(json.dumps({"steps": args.steps, "pushes": dict(pushes), "rows": dict(rows)}))


if __name__ == "__main__":
    main()
