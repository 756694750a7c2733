"""Chart query and ingest figures on PostgreSQL: ingests a run of 1,000,000 loss points through the API's
batch endpoint (the ingest rate), then prints the median time of a 1,000-point bucketed query (full range
and zoomed). Targets (issue 5): query <= 100 ms median, ingest >= 20,000 points/s.

Usage: .venv/bin/python bench/metrics_query.py [--points 1000000]   (needs PostgreSQL on 127.0.0.1)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.services import Stack, postgres_database, redis_database
from tests.tiny import tiny_plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=5_000)
    args = ap.parse_args()
    import tempfile

    with postgres_database() as pg, redis_database() as redis_url, tempfile.TemporaryDirectory() as home:
        stack = Stack(Path(home), pg, redis_url, worker=False).start()
        try:
            with stack.client() as admin:
                plan_id = admin.post("/api/plans", json=tiny_plan()).json()["id"]
                run_id = admin.post("/api/runs", json={"plan_id": plan_id,
                                                       "run": {"data": {"path": "/tmp/x"}}}).json()["id"]
            # an admin imports points into a run that has not started (a worker token may write only the run it
            # claimed, once started: backend/runs/service.py require_writable_run); the ingest path is the same
            ingest_rate(stack.url, stack.admin_token, run_id, args.points, args.batch)
            analyze(pg)
            query_times(stack.url, stack.admin_token, run_id, args.points)
        finally:
            stack.stop()


def analyze(pg_url: str) -> None:
    import psycopg

    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE metrics")
        conn.execute("VACUUM ANALYZE metric_rollups")


def ingest_rate(api: str, token: str, run_id: int, n: int, batch: int, clients: int = 4) -> None:
    import math
    import random

    rng = random.Random(0)
    batches = [[{"rank": 0, "step": s, "name": "loss", "value": 10.0 / (1 + s / 1000.0) + rng.random() * 0.1,
                 "wall_time": float(s)} for s in range(i, min(i + batch, n + 1))] for i in range(1, n + 1, batch)]
    assert math.isfinite(batches[0][0]["value"])
    url = f"{api}/api/runs/{run_id}/metrics"
    with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {token}"}) as client:
        t = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            def post(batch: list[dict]) -> int:
                for _ in range(3):  # a keep-alive connection the server just closed: send again (idempotent)
                    try:
                        return client.post(url, json={"points": batch}).status_code
                    except httpx.TransportError:
                        retries.append(1)
                return 599

            retries: list[int] = []
            results = list(pool.map(post, batches))
        dt = time.perf_counter() - t
    errors = sum(code != 200 for code in results)
    print(f"ingest through the API: {n:,} points in {dt:.2f} s = {n / dt:,.0f} points/s "
          f"({len(batches)} batches of {batch}, {clients} clients, {errors} errors, {len(retries)} resent after a "
          f"dropped connection; target >= 20,000/s)")


def query_times(api: str, token: str, run_id: int, n: int, repeats: int = 15) -> None:
    url = f"{api}/api/runs/{run_id}/metrics"
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {token}"}) as client:
        for label, params in [("full range", {}), ("zoom 10%", {"start": n // 2, "end": n // 2 + n // 10}),
                              ("zoom 0.1%", {"start": n // 3, "end": n // 3 + n // 1000})]:
            times, buckets = [], 0
            for _ in range(repeats):
                t = time.perf_counter()
                r = client.get(url, params={"name": "loss", "points": 1000, **params})
                times.append((time.perf_counter() - t) * 1000)
                buckets = len(r.json()["series"][0]["step"])
            print(f"chart query, {label}: median {statistics.median(times):.1f} ms, "
                  f"p90 {sorted(times)[int(0.9 * len(times))]:.1f} ms over {repeats} calls, {buckets} buckets "
                  f"(target <= 100 ms)")


if __name__ == "__main__":
    main()
