"""The job's timeline: every ``ps_stats_every`` seconds rank 0 asks the shards for their STATS
and keeps one entry: the time, the step, the speed since the previous entry, the shards' RSS and
the rows they hold, in memory and on disk, the largest write-ahead log. The summary carries the
entries as ``timeline``.

One STATS request every few seconds costs a round trip to each shard, nothing a step can see
(a step is milliseconds; a sample is taken at a step boundary only once its time has come).
"""

from __future__ import annotations

import time

# Summed over shards and tables in each entry; a counter a shard does not report counts 0.
ROW_COUNTERS = ("rows", "rows_in_memory", "rows_on_disk", "disk_bytes")


def timeline_entry(shard_stats: list[dict], t_s: float, step: int, samples_per_s: float) -> dict:
    """One entry of the timeline from the shards' STATS (one dict per shard): the largest shard's
    RSS now (``rss_bytes``) and their sum (``rss_bytes_sum``), and :data:`ROW_COUNTERS` summed.

    Example:
        >>> timeline_entry([{"tables": {"t": {"rows": 5, "rows_in_memory": 2, "rows_on_disk": 3}}, "rss_bytes": 10},
        ...                 {"tables": {"t": {"rows": 4, "rows_in_memory": 4}}, "rss_bytes": 12}], 10.0, 40, 2048.0)
        {'t_s': 10.0, 'step': 40, 'samples_per_s': 2048.0, 'rss_bytes': 12, 'rss_bytes_sum': 22, 'rows': 9, 'rows_in_memory': 6, 'rows_on_disk': 3, 'disk_bytes': 0, 'wal_log_bytes': 0}
    """
    tables = [t for s in shard_stats for t in s.get("tables", {}).values()]
    rss = [int(s.get("rss_bytes", 0)) for s in shard_stats]
    return {"t_s": t_s, "step": step, "samples_per_s": samples_per_s, "rss_bytes": max(rss, default=0),
            "rss_bytes_sum": sum(rss), **{k: sum(int(t.get(k, 0)) for t in tables) for k in ROW_COUNTERS},
            "wal_log_bytes": max((int(s.get("wal_log_bytes", 0)) for s in shard_stats), default=0)}


class Timeline:
    """Samples of the shards' STATS at the step boundaries past every ``every_s`` seconds.

    Args:
        stats: asks the shards; one dict per shard (:meth:`het.ps.client.client.PSClient.stats`).
        every_s: seconds between samples (0: never).
        samples_per_step: the samples of one step over every worker (batch x workers).
        step: the step training starts from (a resumed job's is not 0).
        clock: seconds, monotonic; the timeline's time 0 is this object's making.

    Example:
        >>> now = [0.0]
        >>> timeline = Timeline(lambda: [{"rss_bytes": 7}], every_s=10, samples_per_step=100, clock=lambda: now[0])
        >>> now[0] = 4.0; timeline.after_step(2) is None   # not yet time
        True
        >>> now[0] = 12.5; timeline.after_step(5)["samples_per_s"]   # 5 steps of 100 samples in 12.5 s
        40.0
        >>> now[0] = 19.0; timeline.after_step(6) is None   # the next sample is due at 20 s
        True
    """

    def __init__(self, stats, every_s: float, samples_per_step: int, step: int = 0, clock=time.perf_counter):
        self.entries: list[dict] = []
        self._stats, self.every_s, self.samples_per_step, self._clock = stats, every_s, samples_per_step, clock
        self._start = clock()
        self._previous = (0.0, step)  # (t_s, step) of the previous entry, or of the start
        self._due = every_s

    @property
    def last(self) -> dict | None:
        return self.entries[-1] if self.entries else None

    def after_step(self, step: int) -> dict | None:
        """Take a sample if one is due (``step`` steps are done); the new entry, or None."""
        if not self.every_s:
            return None
        t = self._clock() - self._start
        if t < self._due:
            return None
        t0, step0 = self._previous
        rate = (step - step0) * self.samples_per_step / (t - t0) if t > t0 else 0.0
        entry = timeline_entry(self._stats(), round(t, 3), step, rate)
        self.entries.append(entry)
        self._previous = (t, step)
        self._due = (t // self.every_s + 1) * self.every_s  # on the grid of every_s: 10, 20, 30 s ...
        return entry


def disk_postfix(entry: dict | None) -> dict:
    """The progress bar's rows in memory and on disk, once the last entry shows rows on disk.

    Example:
        >>> disk_postfix({"rows_in_memory": 1_234_567, "rows_on_disk": 45_000}), disk_postfix(None)
        ({'mem': '1.2M', 'disk': '45.0k'}, {})
    """
    if not entry or not entry.get("rows_on_disk"):
        return {}
    return {"mem": short_count(entry["rows_in_memory"]), "disk": short_count(entry["rows_on_disk"])}


def short_count(n: float) -> str:
    """``n`` in a few characters.

    Example:
        >>> short_count(950), short_count(1_234_567), short_count(3.2e9)
        ('950', '1.2M', '3.2G')
    """
    for size, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"
