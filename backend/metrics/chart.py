"""The chart query: at most `points` buckets per rank over a step range, each with min, max and last value,
computed in SQL. Buckets are W steps wide and aligned to multiples of W, where W is a multiple of the
largest rollup tier T <= the width the budget allows; whole T-blocks inside the range come from
metric_rollups and the partial blocks at the two edges from the raw rows, so a 1,000,000-step range reads
about 16 rows per bucket instead of 1,000."""
from __future__ import annotations

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
      AND ((step >= :start AND step < :lo_full) OR (step >= :hi_full AND step <= :stop))
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
    if tier > 1:
        b0, b1 = -(-start // tier), (stop + 1) // tier  # whole blocks inside [start, stop]
        if b1 > b0:
            params.update(b0=b0, b1=b1, lo_full=b0 * tier, hi_full=b1 * tier)
            sql = _QUERY.format(rollups=_ROLLUPS)
        else:
            tier = 1
    if tier == 1:
        params.update(lo_full=stop + 1, hi_full=stop + 1)
        sql = _QUERY.format(rollups="")
    series: dict[int, SeriesOut] = {}
    for rank, step, vmin, vmax, last in session.execute(text(sql), params):
        s = series.setdefault(rank, SeriesOut(rank=rank, step=[], min=[], max=[], last=[]))
        s.step.append(step)
        s.min.append(vmin)
        s.max.append(vmax)
        s.last.append(last)
    return MetricQueryOut(name=name, series=list(series.values()))


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
