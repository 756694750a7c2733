"""Load on the API over loopback: the estimate endpoint and metric ingest, 50 concurrent clients each for
30 s (bounded in time and count), against a fresh API on PostgreSQL. Prints requests/s, p50/p99 latency and
the error count. Targets (issue 6): zero errors, p99 of the estimate <= 50 ms.

Usage: .venv/bin/python bench/load.py [--clients 50] [--seconds 30] [--workers 1]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.services import Stack, postgres_database, redis_database  # noqa: E402
from tests.tiny import tiny_plan  # noqa: E402

QWEN = {"model": {"preset": "Qwen/Qwen3-4B"}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 4},
        "parallel": {"sp_size": 4}, "training": {"seq_len": 65536, "grad_accum": 8, "offload_optimizer": True}}
MAX_REQUESTS = 200_000  # a hard bound besides the time limit


async def hammer(name: str, url: str, token: str, make_request, clients: int, seconds: float) -> None:
    latencies: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, limits=limits,
                                 timeout=30) as client:
        async def one_client(i: int) -> None:
            nonlocal errors
            n = 0
            while time.monotonic() < stop and len(latencies) < MAX_REQUESTS:
                method, path, body = make_request(i, n)
                t = time.perf_counter()
                try:
                    r = await client.request(method, path, json=body)
                    ok = r.status_code < 400
                except httpx.HTTPError:
                    ok = False
                latencies.append((time.perf_counter() - t) * 1000)
                errors += not ok
                n += 1

        t0 = time.monotonic()
        await asyncio.gather(*(one_client(i) for i in range(clients)))
        elapsed = time.monotonic() - t0
    lat = sorted(latencies)
    print(f"{name:<16} {len(lat) / elapsed:8.0f} req/s   p50 {statistics.median(lat):6.1f} ms   "
          f"p99 {lat[int(0.99 * (len(lat) - 1))]:6.1f} ms   errors {errors}   ({len(lat)} requests, {clients} clients, "
          f"{elapsed:.0f} s)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--batch", type=int, default=100, help="points per ingest request")
    ap.add_argument("--workers", type=int, default=1, help="API processes")
    args = ap.parse_args()
    with postgres_database() as pg, redis_database(15) as broker, tempfile.TemporaryDirectory() as home:
        stack = Stack(Path(home), pg, broker, worker=False)
        stack.api.cmd += ["--workers", str(args.workers)]
        stack.start()
        try:
            with stack.client() as admin:
                plan_id = admin.post("/api/plans", json=tiny_plan()).json()["id"]
                run_id = admin.post("/api/runs", json={"plan_id": plan_id,
                                                       "run": {"data": {"path": "/tmp/x"}}}).json()["id"]
            worker_token = stack.token("worker")
            print(f"API at {stack.url} ({args.workers} uvicorn process(es), PostgreSQL); loopback only; the load "
                  f"generator runs on the same 2 cores")
            asyncio.run(hammer("POST /api/estimate", stack.url, stack.admin_token,
                               lambda i, n: ("POST", "/api/estimate", QWEN), args.clients, args.seconds))

            def ingest(i: int, n: int):
                base = (i * 1_000_000) + n * args.batch
                return ("POST", f"/api/runs/{run_id}/metrics",
                        {"points": [{"rank": i % 8, "step": base + k, "name": "loss", "value": 1.0, "wall_time": 0}
                                    for k in range(args.batch)]})

            asyncio.run(hammer(f"POST metrics x{args.batch}", stack.url, worker_token, ingest, args.clients,
                               args.seconds))
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
