"""The chart query: at most `points` buckets per rank over a step range, each with min, max and last value,
computed in SQL. Buckets are W steps wide and aligned to multiples of W, where W is a multiple of the
largest rollup tier T <= the width the budget allows; whole T-blocks inside the range come from
metric_rollups and the partial blocks at the two edges from the raw rows, so a 1,000,000-step range reads
about 16 rows per bucket instead of 1,000.

Answers are kept for ULAB_CHART_CACHE_S, as JSON, by (run, name, range, points): many dashboards on one run's chart
cost one query a period: the first asker past the period computes while the others get the last answer
(backend/metrics/router.py). An
ingest forgets the run's answers in its own process (backend/metrics/service.py); another API process's answers
are at most ULAB_CHART_CACHE_S old."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from backend.metrics.models import MetricPoint
from backend.metrics.schemas import MetricQueryOut, SeriesOut, StepAxesOut

TIERS = (16, 256, 4096, 65536)

_QUERY = """
WITH parts AS (
    SELECT rank, step AS s, value AS vmin, value AS vmax, step AS ls, value AS lv
    FROM metrics
    WHERE run_id = :run_id AND name = :name
      AND ((step >= :start AND step < :lo_raw) OR (step >= :hi_raw AND step <= :stop))
    {rollups}
), g AS (
    SELECT rank, ls, lv,
           MIN(vmin) OVER (PARTITION BY rank, s / :width) AS bmin,
           MAX(vmax) OVER (PARTITION BY rank, s / :width) AS bmax,
           ROW_NUMBER() OVER (PARTITION BY rank, s / :width ORDER BY ls DESC) AS rn
    FROM parts
)
SELECT rank, ls, bmin, bmax, lv FROM g WHERE rn = 1 ORDER BY rank, ls
"""
_ROLLUPS = """
    UNION ALL
    SELECT rank, bucket * :tier AS s, vmin, vmax, last_step AS ls, last_value AS lv
    FROM metric_rollups
    WHERE run_id = :run_id AND name = :name AND tier = :tier AND bucket >= :b0 AND bucket < :b1
"""
# The edges, outside the whole T-blocks: whole blocks of the tier below, then raw rows (a 10M-step range would
# otherwise read up to 2 x 4,095 raw rows at its edges)
_EDGE_ROLLUPS = """
    UNION ALL
    SELECT rank, bucket * :edge_tier AS s, vmin, vmax, last_step AS ls, last_value AS lv
    FROM metric_rollups
    WHERE run_id = :run_id AND name = :name AND tier = :edge_tier
      AND ((bucket >= :e0 AND bucket < :e0_full) OR (bucket >= :e1_full AND bucket < :e1))
"""


def plan_buckets(start: int, stop: int, points: int) -> tuple[int, int]:
    """(bucket width W, rollup tier T or 1 for raw rows only): W is a multiple of T, and at most `points`
    W-aligned buckets cover [start, stop]."""
    span = stop - start + 1
    budget = max(1, points - 1)  # alignment to multiples of W can add one bucket
    want = -(-span // budget)
    tier = max([t for t in TIERS if t <= want], default=1)
    width = tier * -(-want // tier)
    while stop // width - start // width + 1 > points:
        width += tier
    return width, tier


def query(session: Session, run_id: int, name: str, start: int | None, stop: int | None,
          points: int) -> MetricQueryOut:
    if start is None or stop is None:
        lo, hi = session.execute(select(func.min(MetricPoint.step), func.max(MetricPoint.step))
                                 .where(MetricPoint.run_id == run_id, MetricPoint.name == name)).one()
        if lo is None:
            return MetricQueryOut(name=name, series=[])
        start = lo if start is None else start
        stop = hi if stop is None else stop
    if stop < start:
        return MetricQueryOut(name=name, series=[])
    width, tier = plan_buckets(start, stop, points)
    params = {"run_id": run_id, "name": name, "start": start, "stop": stop, "width": width, "tier": tier}
    sql = _QUERY.format(rollups="")
    params.update(lo_raw=stop + 1, hi_raw=stop + 1)  # raw rows only, unless whole blocks lie inside the range
    if tier > 1:
        b0, b1 = -(-start // tier), (stop + 1) // tier  # whole blocks inside [start, stop]
        if b1 > b0:
            lo_full, hi_full = b0 * tier, b1 * tier
            params.update(b0=b0, b1=b1, lo_raw=lo_full, hi_raw=hi_full)
            sql = _QUERY.format(rollups=_ROLLUPS)
            edge = max([t for t in TIERS if t < tier], default=1)
            if edge > 1:
                e0, e1 = -(-start // edge), (stop + 1) // edge  # whole edge blocks, at most lo_full and from hi_full
                params.update(edge_tier=edge, e0=e0, e1=e1, e0_full=lo_full // edge, e1_full=hi_full // edge,
                              lo_raw=e0 * edge, hi_raw=e1 * edge)
                sql = _QUERY.format(rollups=_ROLLUPS + _EDGE_ROLLUPS)
    series: dict[int, tuple[list, list, list, list]] = {}
    for rank, step, vmin, vmax, last in session.execute(text(sql), params).all():
        if (columns := series.get(rank)) is None:
            columns = series[rank] = ([], [], [], [])
        columns[0].append(step)
        columns[1].append(vmin)
        columns[2].append(vmax)
        columns[3].append(last)
    return MetricQueryOut(name=name, series=[SeriesOut(rank=rank, step=st, min=lo, max=hi, last=la)
                                             for rank, (st, lo, hi, la) in series.items()])


class AnswerCache:
    """JSON answers by key for `ttl_s`, at most `max_bytes` of them (the least recently used go first); one
    computation a key at a time: while it runs, the others get the key's last answer, or wait for it when there is
    none. A key's first item is its group (a run): `forget` drops a group's answers, and an answer computed while
    its group was forgotten is not kept."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._answers: OrderedDict[tuple, tuple[float, bytes]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._computing: dict[tuple, threading.Lock] = {}
        self._generation: dict[object, int] = {}

    def get(self, key: tuple, ttl_s: float, compute: Callable[[], bytes]) -> bytes:
        if ttl_s <= 0:
            return compute()
        fresh, kept = self._lookup(key)
        if kept is not None and fresh:
            return kept
        with self._lock:
            computing = self._computing.setdefault(key, threading.Lock())
        if not computing.acquire(blocking=kept is None):
            assert kept is not None  # only an asker with an answer to fall back on does not wait
            return kept  # another asker is computing it anew
        try:  # the first asker computes; askers with no answer to fall back on wait and find its answer
            fresh, kept = self._lookup(key)
            if kept is not None and fresh:
                return kept
            generation = self._generation.get(key[0], 0)
            answer = compute()
            self._put(key, time.monotonic() + ttl_s, answer, generation)
            return answer
        finally:
            computing.release()
            with self._lock:  # an asker still holding it computes once more at worst
                self._computing.pop(key, None)

    def fresh(self, key: tuple) -> bytes | None:
        """The key's answer while it is fresh, else None; never waits for a computation."""
        fresh, kept = self._lookup(key)
        return kept if fresh else None

    def forget(self, group: object) -> None:
        with self._lock:
            self._generation[group] = self._generation.get(group, 0) + 1
            for key in [k for k in self._answers if k[0] == group]:
                self._bytes -= len(self._answers.pop(key)[1])

    def _lookup(self, key: tuple) -> tuple[bool, bytes | None]:
        """(whether the kept answer is fresh, the kept answer or None)."""
        with self._lock:
            found = self._answers.get(key)
            if found is None:
                return False, None
            self._answers.move_to_end(key)
            return found[0] >= time.monotonic(), found[1]

    def _put(self, key: tuple, expires: float, answer: bytes, generation: int) -> None:
        with self._lock:
            if self._generation.get(key[0], 0) != generation:
                return
            old = self._answers.pop(key, None)
            self._bytes -= len(old[1]) if old else 0
            self._answers[key] = (expires, answer)
            self._bytes += len(answer)
            while self._bytes > self.max_bytes and self._answers:
                _, (_, dropped) = self._answers.popitem(last=False)
                self._bytes -= len(dropped)


ANSWERS = AnswerCache(max_bytes=64 << 20)  # 1,000 buckets of 8 ranks are ~0.3 MB of JSON


# The trainer's per-step token count (worker/trainer/callbacks.py `tokens`, rank 0), summed in step order.
_AXES = """
WITH t AS (
    SELECT step, wall_time, SUM(value) OVER (ORDER BY step) AS tokens
    FROM metrics WHERE run_id = :run_id AND name = 'tokens' AND rank = 0
)
SELECT step, wall_time, tokens FROM t WHERE step % :width = 0 OR step = :lo OR step = :hi ORDER BY step
"""


def axes(session: Session, run_id: int, points: int) -> StepAxesOut:
    lo, hi = session.execute(select(func.min(MetricPoint.step), func.max(MetricPoint.step)).where(
        MetricPoint.run_id == run_id, MetricPoint.name == "tokens", MetricPoint.rank == 0)).one()
    if lo is None:
        return StepAxesOut(step=[], wall_s=[], tokens=[])
    width, _ = plan_buckets(lo, hi, points)
    rows = session.execute(text(_AXES), {"run_id": run_id, "width": width, "lo": lo, "hi": hi}).all()
    start = min((w for _, w, _ in rows if w and w > 0), default=None)
    return StepAxesOut(step=[s for s, _, _ in rows], tokens=[float(t) for _, _, t in rows],
                       wall_s=[w - start if start is not None and w and w > 0 else None for _, w, _ in rows])
