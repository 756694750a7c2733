"""Load on the API over loopback: the estimate endpoint and metric ingest, 50 concurrent clients each for
30 s (bounded in time and count), against a fresh API on PostgreSQL. Prints requests/s, p50/p99 latency,
the error count and the CPU time per request of the API and of this load generator. Targets: zero
errors, p99 of the estimate <= 50 ms.

Three phases:
- estimate, paced: each client is a planner user whose form asks for an estimate every `--think-ms`
  (default 250 ms, the form's debounce), i.e. 50 clients offer 200 requests/s;
- estimate, saturated: each client sends its next request as soon as the last is answered (capacity);
- metric ingest, saturated: batches of `--batch` points, as workers ship them.
On this 2-core machine the generator and the API share the cores, so the saturated latencies are mostly
queueing: with N closed-loop clients, latency = N / throughput.

The clients speak HTTP/1.1 over raw asyncio streams (keep-alive, one connection each): a full HTTP client
library costs more CPU per request than the API does, and would measure itself.

Usage: .venv/bin/python bench/load.py [--clients 50] [--seconds 30] [--think-ms 250] [--workers 1]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.services import Stack, postgres_database, redis_database
from tests.tiny import tiny_plan

QWEN = {"model": {"preset": "Qwen/Qwen3-4B"}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 4},
        "parallel": {"sp_size": 4}, "training": {"seq_len": 65536, "grad_accum": 8, "offload_optimizer": True}}
MAX_REQUESTS = 200_000  # a hard bound besides the time limit


class Connection:
    """One keep-alive HTTP/1.1 connection; enough of the protocol for this API (Content-Length bodies)."""

    def __init__(self, host: str, port: int, token: str):
        self.host, self.port, self.token = host, port, token
        self.reader = self.writer = None

    async def request(self, method: str, path: str, body: dict | None) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        data = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {self.token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
        try:
            self.writer.write(head + data)
            header = await self.reader.readuntil(b"\r\n\r\n")
            status = int(header.split(b" ", 2)[1])
            length = 0
            for line in header.split(b"\r\n")[1:]:
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await self.reader.readexactly(length)
            return status
        except (OSError, asyncio.IncompleteReadError, ValueError):
            self.close()
            raise

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children that were waited for (uvicorn workers)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def api_cpu_seconds(stack: Stack) -> float:
    pids = [stack.api.proc.pid]
    children = Path(f"/proc/{stack.api.proc.pid}/task/{stack.api.proc.pid}/children")
    if children.is_file():
        pids += [int(p) for p in children.read_text().split()]
    return sum(cpu_seconds(p) for p in pids)


async def hammer(name: str, url: str, token: str, make_request, clients: int, seconds: float,
                 think_s: float, stack: Stack) -> None:
    parts = urlsplit(url)
    latencies: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds

    async def one_client(i: int) -> None:
        nonlocal errors
        conn, n = Connection(parts.hostname, parts.port, token), 0
        await asyncio.sleep(think_s * i / clients)  # paced clients start spread over one think time
        next_at = time.monotonic()
        while time.monotonic() < stop and len(latencies) < MAX_REQUESTS:
            method, path, body = make_request(i, n)
            t = time.perf_counter()
            try:
                ok = await conn.request(method, path, body) < 400
            except (OSError, asyncio.IncompleteReadError, ValueError):
                ok = False
            latencies.append((time.perf_counter() - t) * 1000)
            errors += not ok
            n += 1
            if think_s:
                next_at += think_s
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        conn.close()

    api0, gen0, t0 = api_cpu_seconds(stack), time.process_time(), time.monotonic()
    await asyncio.gather(*(one_client(i) for i in range(clients)))
    elapsed = time.monotonic() - t0
    api_ms = (api_cpu_seconds(stack) - api0) * 1000
    gen_ms = (time.process_time() - gen0) * 1000
    lat = sorted(latencies)
    n = len(lat)
    offered = f"{clients / think_s:.0f} req/s offered" if think_s else "saturated"
    print(f"{name:<28} {n / elapsed:6.0f} req/s ({offered})   p50 {statistics.median(lat):7.1f} ms   "
          f"p99 {lat[int(0.99 * (n - 1))]:7.1f} ms   errors {errors}   CPU per request: API {api_ms / n:.2f} ms, "
          f"generator {gen_ms / n:.2f} ms   ({n} requests, {clients} clients, {elapsed:.0f} s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--think-ms", type=float, default=250, help="pause between a paced client's requests")
    ap.add_argument("--batch", type=int, default=100, help="points per ingest request")
    ap.add_argument("--workers", type=int, default=1, help="API processes")
    args = ap.parse_args()
    with postgres_database() as pg, redis_database() as broker, tempfile.TemporaryDirectory() as home:
        stack = Stack(Path(home), pg, broker, worker=False)
        stack.api.cmd += ["--workers", str(args.workers)]
        stack.start()
        try:
            with stack.client() as admin:
                plan_id = admin.post("/api/plans", json=tiny_plan()).json()["id"]
                run_id = admin.post("/api/runs", json={"plan_id": plan_id,
                                                       "run": {"data": {"path": "/tmp/x"}}}).json()["id"]
            # An admin imports points into a run that has not started (a worker token may write only the run it
            # claimed, once started: backend/runs/service.py require_writable_run); the ingest path is the same.
            ingest_token = stack.admin_token
            print(f"API at {stack.url} ({args.workers} uvicorn process(es), PostgreSQL); loopback only; the load "
                  f"generator runs on the same {os.cpu_count()} cores", flush=True)

            def estimate(i: int, n: int):
                return "POST", "/api/estimate", QWEN

            def ingest(i: int, n: int):
                base = (i * 1_000_000) + n * args.batch
                return ("POST", f"/api/runs/{run_id}/metrics",
                        {"points": [{"rank": i % 8, "step": base + k, "name": "loss", "value": 1.0, "wall_time": 0}
                                    for k in range(args.batch)]})

            for name, token, make, think in [
                    ("POST /api/estimate, paced", stack.admin_token, estimate, args.think_ms / 1000),
                    ("POST /api/estimate", stack.admin_token, estimate, 0.0),
                    (f"POST metrics x{args.batch}", ingest_token, ingest, 0.0)]:
                asyncio.run(hammer(name, stack.url, token, make, args.clients, args.seconds, think, stack))
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
