"""Metric ingest: an idempotent upsert of the points, and of the rollups the chart query reads."""
from __future__ import annotations

import json
import math

from sqlalchemy import case, func, select, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from backend.metrics.chart import ANSWERS, TIERS
from backend.metrics.models import MetricPoint, MetricRollup
from backend.metrics.schemas import PointIn


def _sqlite_upserts():
    """SQLite (the embedded default): executemany of single-row upserts through SQLAlchemy's SQLite dialect.
    A rewritten point (a resumed attempt redoing the steps after its checkpoint) updates the value, unless an older
    attempt sends it (a late resend: the newest attempt's value stays); a block's
    min and max keep the extremes of the stored and the new summary, `last` follows the later step."""
    points = sqlite_insert(MetricPoint)
    points = points.on_conflict_do_update(
        index_elements=["run_id", "name", "step", "rank"],
        set_={"value": points.excluded.value, "wall_time": points.excluded.wall_time,
              "attempt": points.excluded.attempt},
        where=func.coalesce(points.excluded.attempt, 0) >= func.coalesce(MetricPoint.attempt, 0))
    r = MetricRollup
    rollups = sqlite_insert(r)
    new = rollups.excluded
    rollups = rollups.on_conflict_do_update(
        index_elements=["run_id", "name", "tier", "bucket", "rank"],
        set_={"vmin": func.min(r.vmin, new.vmin), "vmax": func.max(r.vmax, new.vmax),  # SQLite's scalar min/max
              "last_value": case((new.last_step >= r.last_step, new.last_value), else_=r.last_value),
              "last_step": func.max(r.last_step, new.last_step)})
    return points, rollups


_SQLITE_POINTS, _SQLITE_ROLLUPS = _sqlite_upserts()


def block_summaries(run_id: int, rows: list[dict]) -> list[dict]:
    """Min, max and last value of the batch's points per (name, rank, tier, block)."""
    blocks: dict[tuple, dict] = {}
    for r in rows:
        for tier in TIERS:
            key = (r["name"], r["rank"], tier, r["step"] // tier)
            b = blocks.get(key)
            if b is None:
                blocks[key] = {"run_id": run_id, "name": r["name"], "rank": r["rank"], "tier": tier,
                               "bucket": key[3], "vmin": r["value"], "vmax": r["value"], "last_step": r["step"],
                               "last_value": r["value"]}
            else:
                b["vmin"], b["vmax"] = min(b["vmin"], r["value"]), max(b["vmax"], r["value"])
                if r["step"] >= b["last_step"]:
                    b["last_step"], b["last_value"] = r["step"], r["value"]
    return list(blocks.values())


def ingest(session: Session, run_id: int, points: list[PointIn], attempt: int | None = None) -> int:
    """Insert or overwrite points keyed by (run, name, step, rank), as stored by `attempt` of the run: a resend
    never duplicates, and never overwrites what a newer attempt stored. Non-finite values are not stored (their
alerts are raised by the caller first: backend/metrics/router.py); the session is committed."""
    if not points:
        return 0
    points = [p for p in points if math.isfinite(p.value)]
    latest: dict[tuple, PointIn] = {}
    for p in points:  # one key once per batch: the last write of a step wins
        latest[(p.name, p.step, p.rank)] = p
    # Key order: concurrent batches then lock shared rows (the rollup blocks) in the same order and wait
    # for each other instead of deadlocking.
    ordered = [latest[k] for k in sorted(latest)]
    if not ordered:  # only non-finite points: their alerts are all there is to keep
        session.commit()
        return 0
    if session.get_bind().dialect.name == "postgresql":
        _ingest_postgresql(session, run_id, ordered, attempt)
    else:
        rows = [{"run_id": run_id, "rank": p.rank, "step": p.step, "name": p.name, "value": p.value,
                 "wall_time": p.wall_time, "attempt": attempt} for p in ordered]
        blocks = sorted(block_summaries(run_id, rows), key=lambda b: (b["name"], b["tier"], b["bucket"], b["rank"]))
        session.execute(_SQLITE_POINTS, rows)
        session.execute(_SQLITE_ROLLUPS, blocks)
    session.commit()
    ANSWERS.forget(run_id)  # the run's charts in this process are computed anew
    return len(ordered)


# PostgreSQL: one statement, one round trip, for the whole batch. The points travel as one JSON parameter
# and are unpacked by json_to_recordset in the server; the block summaries are computed in SQL from the same
# rows. Against five array parameters and two statements, per 5,000 points here: 182 vs 224 ms wall and 27 vs
# 74 ms of the API's Python (psycopg dumps list parameters element by element), which 4 concurrent shippers
# share under one GIL.
_ROLLUP_UPSERT = """
INSERT INTO metric_rollups (run_id, name, tier, bucket, rank, vmin, vmax, last_step, last_value)
SELECT :run_id, p.name, t.tier, p.step / t.tier, p.rank, MIN(p.value), MAX(p.value), MAX(p.step),
       (ARRAY_AGG(p.value ORDER BY p.step DESC))[1]
FROM p, unnest(CAST(:tiers AS integer[])) AS t(tier)
GROUP BY p.name, t.tier, p.step / t.tier, p.rank
ORDER BY 2, 3, 4, 5
ON CONFLICT (run_id, name, tier, bucket, rank) DO UPDATE SET
    vmin = LEAST(metric_rollups.vmin, excluded.vmin),
    vmax = GREATEST(metric_rollups.vmax, excluded.vmax),
    last_value = CASE WHEN excluded.last_step >= metric_rollups.last_step
                      THEN excluded.last_value ELSE metric_rollups.last_value END,
    last_step = GREATEST(metric_rollups.last_step, excluded.last_step)
"""
_PG_INGEST = text("""
WITH p AS (
    SELECT * FROM ROWS FROM (json_to_recordset(CAST(:points AS json))
        AS (rank integer, step integer, name varchar, value double precision, wall_time double precision))
        WITH ORDINALITY AS p(rank, step, name, value, wall_time, ord)
), stored AS (
    INSERT INTO metrics (run_id, rank, step, name, value, wall_time, attempt)
    SELECT :run_id, p.rank, p.step, p.name, p.value, p.wall_time, CAST(:attempt AS integer) FROM p ORDER BY p.ord
    ON CONFLICT (run_id, name, step, rank) DO UPDATE SET value = excluded.value, wall_time = excluded.wall_time,
        attempt = excluded.attempt
        WHERE COALESCE(excluded.attempt, 0) >= COALESCE(metrics.attempt, 0)
)""" + _ROLLUP_UPSERT)
# The same rollups from the points a run already has (points written around ingest: a bulk load).
_PG_ROLLUP_STORED = text("WITH p AS (SELECT rank, step, name, value FROM metrics WHERE run_id = :run_id)"
                         + _ROLLUP_UPSERT)


def _ingest_postgresql(session: Session, run_id: int, points: list[PointIn], attempt: int | None) -> None:
    rows = json.dumps([{"rank": p.rank, "step": p.step, "name": p.name, "value": p.value,
                        "wall_time": p.wall_time} for p in points])
    session.execute(_PG_INGEST, {"run_id": run_id, "points": rows, "tiers": list(TIERS), "attempt": attempt})


def rollup_stored(session: Session, run_id: int) -> None:
    """Merge the run's stored points into its rollups (PostgreSQL), as ingest would have; the caller commits."""
    session.execute(_PG_ROLLUP_STORED, {"run_id": run_id, "tiers": list(TIERS)})


def names(session: Session, run_id: int) -> list[str]:
    return list(session.scalars(select(MetricPoint.name).where(MetricPoint.run_id == run_id).distinct()
                                .order_by(MetricPoint.name)))


def points_after(session: Session, run_id: int, cursor: int, limit: int = 5000) -> tuple[int, list[dict]]:
    """New points of a run with id above the cursor, for the live stream; returns the new cursor."""
    rows = session.execute(select(MetricPoint.id, MetricPoint.rank, MetricPoint.step, MetricPoint.name,
                                  MetricPoint.value)
                           .where(MetricPoint.run_id == run_id, MetricPoint.id > cursor)
                           .order_by(MetricPoint.id).limit(limit)).all()
    if not rows:
        return cursor, []
    return rows[-1][0], [{"rank": r, "step": s, "name": n, "value": v} for _, r, s, n, v in rows]
