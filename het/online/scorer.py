"""Requests scored together: concurrent requests joined into one forward pass (micro-batching,
what Triton and TorchServe call dynamic batching), bounded by a wait and a number of rows.

A request's instances wait at most ``max_wait_s`` for others, and a batch holds at most
``max_rows`` rows; it is scored by one thread beside the server's event loop, with the version
the model has when the batch starts, which every request of the batch answers with. A request
whose values cannot be read fails alone: the others of its batch are scored.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

import numpy as np
import torch

from het.export.spec import to_arrow
from het.online.live import Live
from het.online.requests import BadRequest, columns_of


class Scorer:
    """Scores checked instances with ``live``'s current version.

    Args:
        live: the served model's versions.
        batching: join concurrent requests (else each is scored alone, in arrival order).
        max_rows: the most rows a batch holds.
        max_wait_s: how long a request waits for others to join its batch.
        on_batch: called with each batch's rows (metrics).
    """

    def __init__(self, live: Live, batching: bool = True, max_rows: int = 512, max_wait_s: float = 0.002,
                 on_batch=None):
        self.live, self.batching = live, batching
        self.max_rows, self.max_wait_s = max_rows, max_wait_s
        self.on_batch = on_batch or (lambda rows: None)
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="het-score")
        self._queue: list[tuple[list, asyncio.Future]] = []
        self._rows = 0
        self._timer: asyncio.TimerHandle | None = None

    async def score(self, instances: list[dict]) -> tuple[list[float], int]:
        """``(probabilities, version)`` of checked instances; BadRequest if a value cannot be read."""
        loop = asyncio.get_running_loop()
        if not self.batching:
            return await loop.run_in_executor(self._executor, self._run_one, instances)
        future = loop.create_future()
        self._queue.append((instances, future))
        self._rows += len(instances)
        if self._rows >= self.max_rows:
            self._flush(loop)
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait_s, self._flush, loop)
        return await future

    def _flush(self, loop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._queue, self._rows = self._queue, [], 0
        if batch:
            task = loop.run_in_executor(self._executor, self._run, [b[0] for b in batch])
            task.add_done_callback(lambda t: _settle([b[1] for b in batch], t))

    def _run_one(self, instances: list[dict]) -> tuple[list[float], int]:
        result = self._run([instances])[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def _run(self, requests: list[list[dict]]) -> list:
        """Score requests together; per request its ``(probabilities, version)`` or its error."""
        version = self.live.current
        model = version.model
        fields = model.inputs.columns[1:]
        flat = [inst for r in requests for inst in r]
        try:
            parsed = model.inputs.parse(to_arrow(columns_of(flat, fields)))
        except ValueError as e:
            if len(requests) == 1:
                return [BadRequest(400, str(e))]
            return [r for req in requests for r in self._run([req])]  # find the request Arrow refused
        ok = parsed.ok
        scores = np.full(len(flat), np.nan, np.float32)
        good = np.flatnonzero(ok)
        if len(good):
            with torch.no_grad():
                scores[good] = model(torch.from_numpy(parsed.dense[good]), torch.from_numpy(parsed.keys[good])).numpy()
        self.on_batch(len(flat))
        out, start = [], 0
        for req in requests:
            end = start + len(req)
            bad = np.flatnonzero(~ok[start:end])
            if len(bad):
                i = int(bad[0])
                reason = parsed.reasons.get(start + i) or _reason_alone(model, req[i], fields)
                out.append(BadRequest(400, f"instances[{i}]: {reason}"))
            else:
                out.append((scores[start:end].astype(float).tolist(), version.number))
            start = end
        return out

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def _reason_alone(model, instance: dict, fields: list[str]) -> str:
    parsed = model.inputs.parse(to_arrow(columns_of([instance], fields)))
    return parsed.reasons.get(0, "cannot be read")


def _settle(futures: list[asyncio.Future], task) -> None:
    error = task.exception()
    results = [error] * len(futures) if error is not None else task.result()
    for future, result in zip(futures, results):
        if future.done():
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
