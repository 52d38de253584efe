"""Requests scored together: concurrent requests joined into one forward pass (micro-batching,
what Triton and TorchServe call dynamic batching), bounded by a wait and a number of rows.

Batches are scored one at a time by one thread beside the server's event loop. Requests that
arrive while a batch is scored wait, and go together in the next one (at most ``max_rows``
rows); a request arriving while the scorer is idle waits ``max_wait_s`` for company (0 by
default: it goes at once, alone, as under no load). So batching costs nothing when requests come
one at a time, and under load a batch holds what arrived during the one before (as Triton's
dynamic batcher with no queue delay). A batch answers with the version the model has when it
starts. A request whose values cannot be read fails alone: the others of its batch are scored.
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
        max_wait_s: how long a request that finds the scorer idle waits for others to join it.
        on_batch: called with each batch's rows (metrics).
    """

    def __init__(self, live: Live, batching: bool = True, max_rows: int = 512, max_wait_s: float = 0.0,
                 on_batch=None):
        self.live, self.batching = live, batching
        self.max_rows, self.max_wait_s = max_rows, max_wait_s
        self.on_batch = on_batch or (lambda rows: None)
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="het-score")
        self._queue: list[tuple[list, asyncio.Future]] = []
        self._rows = 0
        self._timer: asyncio.TimerHandle | None = None
        self._busy = False  # a batch is being scored

    async def score(self, instances: list[dict]) -> tuple[list[float], int]:
        """``(probabilities, version)`` of checked instances; BadRequest if a value cannot be read."""
        loop = asyncio.get_running_loop()
        if not self.batching:
            return await loop.run_in_executor(self._executor, self._run_one, instances)
        future = loop.create_future()
        self._queue.append((instances, future))
        self._rows += len(instances)
        if self._busy and self._rows < self.max_rows:
            return await future  # goes with the next batch, when this one is scored
        if self._rows >= self.max_rows or self.max_wait_s <= 0:
            self._flush(loop)
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait_s, self._flush, loop)
        return await future

    def _flush(self, loop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._busy:
            return  # the batch in flight takes the queue when it is done
        batch, self._queue, self._rows = self._queue[:], [], 0
        if len(batch) and sum(len(b[0]) for b in batch) > self.max_rows:  # keep the rest for the next
            kept, rows = [], 0
            for item in batch:
                if kept and rows + len(item[0]) > self.max_rows:
                    break
                kept.append(item)
                rows += len(item[0])
            self._queue, self._rows = batch[len(kept):], sum(len(b[0]) for b in batch[len(kept):])
            batch = kept
        if batch:
            self._busy = True
            task = loop.run_in_executor(self._executor, self._run, [b[0] for b in batch])
            task.add_done_callback(lambda t: self._done([b[1] for b in batch], t, loop))

    def _done(self, futures: list, task, loop) -> None:
        self._busy = False
        _settle(futures, task)
        if self._queue:  # what arrived meanwhile: the next batch, at once
            self._flush(loop)

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
            parsed = model.inputs.parse(to_arrow(columns_of(flat, fields, model.inputs.spec.get("multi"))))
        except ValueError as e:
            if len(requests) == 1:
                return [BadRequest(400, _refused_where(model, requests[0], fields, e))]
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
                reason = _reason_alone(model, req[i], fields)  # as alone, whatever the batch made of its column
                out.append(BadRequest(400, f"instances[{i}]: {reason}"))
            else:
                out.append((scores[start:end].astype(float).tolist(), version.number))
            start = end
        return out

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def _refused_where(model, instances: list[dict], fields: list[str], error: ValueError) -> str:
    """Arrow's refusal of a request's columns (an integer past 2^53 in a number column, say),
    named with the first instance and field that it refuses alone."""
    multi = model.inputs.spec.get("multi")
    for i, instance in enumerate(instances):
        for name in fields:
            try:
                model.inputs.parse(to_arrow(columns_of([{**dict.fromkeys(fields), name: instance[name]}], fields, multi)))
            except ValueError:
                return f"instances[{i}].{name}: {error}"
    return f"instances: {error}"


def _reason_alone(model, instance: dict, fields: list[str]) -> str:
    try:
        parsed = model.inputs.parse(to_arrow(columns_of([instance], fields, model.inputs.spec.get("multi"))))
    except ValueError as e:  # what Arrow refuses of it alone (an integer past 2^53 in a number column)
        return str(e)
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
