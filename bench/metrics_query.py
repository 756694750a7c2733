"""Chart query figures on PostgreSQL: the ingest rate through the API's batch endpoint, then for runs of each size
in `--points` (filled in SQL with generate_series, rollups included, as ingest would leave them) the time of one
1,000-bucket chart query alone (median and p90 of sequential calls, each computed: full range and zoomed) and
under `--clients` concurrent clients on the same chart (answers shared through the chart cache,
ULAB_CHART_CACHE_S) (closed loop: each sends its next query when the last is answered; p50, p99,
requests/s, the API's CPU per request). Targets: one query <= 100 ms at 10M points, p99 <= 500 ms at 50 clients on
100k points; ingest >= 20,000 points/s.

The clients speak HTTP/1.1 over raw asyncio streams (bench/load.py): the API and the generator share the cores, so
a saturated latency is mostly queueing (N clients / throughput).

Usage: .venv/bin/python bench/metrics_query.py [--points 100000,1000000,10000000] [--clients 50] [--seconds 15]
       [--ingest 200000]   (needs PostgreSQL on 127.0.0.1)
"""
from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.load import Connection, api_cpu_seconds
from tests.services import Stack, postgres_database, redis_database
from tests.tiny import tiny_plan

# rank 0's loss, one point per step, as the trainer ships it
FILL_POINTS = """
INSERT INTO metrics (run_id, rank, step, name, value, wall_time)
SELECT :run_id, 0, s, 'loss', 10.0 / (1 + s / 1000.0) + random() * 0.1, s FROM generate_series(1, :n) AS s
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="100000,1000000,10000000", help="run sizes, comma separated")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=15, help="per concurrent phase")
    ap.add_argument("--repeats", type=int, default=20, help="sequential calls per single-query figure")
    ap.add_argument("--ingest", type=int, default=200_000, help="points ingested through the API (0: skip)")
    ap.add_argument("--batch", type=int, default=5_000)
    args = ap.parse_args()
    sizes = [int(s) for s in args.points.split(",")]
    with postgres_database() as pg, redis_database() as redis_url, tempfile.TemporaryDirectory() as home:
        stack = Stack(Path(home), pg, redis_url, worker=False).start()
        try:
            if args.ingest:
                ingest_rate(stack.url, stack.admin_token, new_run(stack), args.ingest, args.batch)
            rows = []
            for n in sizes:
                run_id = new_run(stack)
                t = time.perf_counter()
                fill(pg, run_id, n)
                print(f"filled a run of {n:,} points (rollups included) in {time.perf_counter() - t:.0f} s",
                      flush=True)
                single = query_times(stack.url, stack.admin_token, run_id, n, args.repeats)
                loaded = asyncio.run(concurrent(stack, run_id, args.clients, args.seconds))
                rows.append((n, single, loaded))
            print_table(rows, args.clients)
        finally:
            stack.stop()


def new_run(stack: Stack) -> int:
    # an admin imports points into a run that has not started (a worker token may write only the run it claimed,
    # once started: backend/runs/service.py require_writable_run); the ingest path is the same
    with stack.client() as admin:
        plan_id = admin.post("/api/plans", json=tiny_plan()).json()["id"]
        return admin.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": "/tmp/x"}}}).json()["id"]


def fill(pg_url: str, run_id: int, n: int) -> None:
    """n points in SQL, then the run's rollups computed from them by the ingest statement's own aggregation."""
    import psycopg

    from backend.metrics.service import rollup_stored

    url = pg_url.replace("+psycopg", "")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FILL_POINTS.replace(":run_id", str(run_id)).replace(":n", str(n)))
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine(pg_url)
    with Session(engine) as session:
        rollup_stored(session, run_id)
        session.commit()
    engine.dispose()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE metrics")
        conn.execute("VACUUM ANALYZE metric_rollups")


def ingest_rate(api: str, token: str, run_id: int, n: int, batch: int, clients: int = 4) -> None:
    rng = random.Random(0)
    batches = [[{"rank": 0, "step": s, "name": "loss", "value": 10.0 / (1 + s / 1000.0) + rng.random() * 0.1,
                 "wall_time": float(s)} for s in range(i, min(i + batch, n + 1))] for i in range(1, n + 1, batch)]
    assert math.isfinite(batches[0][0]["value"])
    url = f"{api}/api/runs/{run_id}/metrics"
    retries: list[int] = []
    with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {token}"}) as client:
        def post(points: list[dict]) -> int:
            for _ in range(3):  # a keep-alive connection the server just closed: send again (idempotent)
                try:
                    return client.post(url, json={"points": points}).status_code
                except httpx.TransportError:
                    retries.append(1)
            return 599

        t = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            results = list(pool.map(post, batches))
        dt = time.perf_counter() - t
    errors = sum(code != 200 for code in results)
    print(f"ingest through the API: {n:,} points in {dt:.2f} s = {n / dt:,.0f} points/s "
          f"({len(batches)} batches of {batch}, {clients} clients, {errors} errors, {len(retries)} resent after a "
          f"dropped connection; target >= 20,000/s)", flush=True)


def query_times(api: str, token: str, run_id: int, n: int, repeats: int) -> dict[str, tuple[float, float]]:
    """{label: (median ms, p90 ms)} of sequential queries of about 1,000 buckets, each computed (a bucket budget of
    its own per call: no answer is served from the API's chart cache)."""
    url = f"{api}/api/runs/{run_id}/metrics"
    out = {}
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {token}"}) as client:
        for label, params in [("full range", {}), ("zoom 10%", {"start": n // 2, "end": n // 2 + n // 10}),
                              ("zoom 0.1%", {"start": n // 3, "end": n // 3 + n // 1000})]:
            times, buckets = [], 0
            for i in range(repeats):
                t = time.perf_counter()
                r = client.get(url, params={"name": "loss", "points": 1000 - i, **params})
                times.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200, r.text
                buckets = len(r.json()["series"][0]["step"])
            times.sort()
            out[label] = (statistics.median(times), times[int(0.9 * (len(times) - 1))])
            print(f"{n:,} points, chart query, {label}: median {out[label][0]:.1f} ms, p90 {out[label][1]:.1f} ms "
                  f"over {repeats} calls, {buckets} buckets", flush=True)
    return out


async def concurrent(stack: Stack, run_id: int, clients: int, seconds: float) -> tuple[float, float, float, float,
                                                                                        int]:
    """(requests/s, p50 ms, p99 ms, API CPU ms per request, errors) of `clients` closed-loop full-range queries."""
    parts = urlsplit(stack.url)
    path = f"/api/runs/{run_id}/metrics?name=loss&points=1000"
    latencies: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds

    async def one_client() -> None:
        nonlocal errors
        conn = Connection(parts.hostname or "127.0.0.1", parts.port or 80, stack.admin_token)
        while time.monotonic() < stop:
            t = time.perf_counter()
            try:
                ok = await conn.request("GET", path, None) == 200
            except (OSError, asyncio.IncompleteReadError, ValueError):
                ok = False
            latencies.append((time.perf_counter() - t) * 1000)
            errors += not ok
        conn.close()

    api0, t0 = api_cpu_seconds(stack), time.monotonic()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    elapsed = time.monotonic() - t0
    lat = sorted(latencies)
    n = len(lat)
    result = (n / elapsed, statistics.median(lat), lat[int(0.99 * (n - 1))],
              (api_cpu_seconds(stack) - api0) * 1000 / n, errors)
    print(f"{clients} clients: {result[0]:.0f} req/s, p50 {result[1]:.1f} ms, p99 {result[2]:.1f} ms, API CPU "
          f"{result[3]:.2f} ms per request, {errors} errors ({n} requests in {elapsed:.0f} s)", flush=True)
    return result


def print_table(rows: list, clients: int) -> None:
    print(f"\n| points | one query computed, full range (median / p90 ms) | zoom 10% | zoom 0.1% | "
          f"{clients} clients: req/s | p50 ms | p99 ms | API CPU ms/request | errors |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, single, (rps, p50, p99, cpu, errors) in rows:
        cells = [f"{single[k][0]:.1f} / {single[k][1]:.1f}" for k in ("full range", "zoom 10%", "zoom 0.1%")]
        print(f"| {n:,} | {' | '.join(cells)} | {rps:.0f} | {p50:.1f} | {p99:.1f} | {cpu:.2f} | {errors} |")


if __name__ == "__main__":
    main()
