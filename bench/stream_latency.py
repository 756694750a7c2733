"""From the trainer writing a step's metrics to the open run page drawing it, end to end: a real tiny run
(torchrun, 2 CPU ranks) through the API, a Celery worker (Redis) and PostgreSQL, watched in Chromium. Each step's
latency is the time the loss chart first held that step minus the `time` the trainer wrote into the step's
metrics.jsonl line (same machine clock). The path: the worker's shipper (polls the file every 0.5 s) -> batch
ingest -> the run's SSE stream (polls the database every 0.25 s) -> the chart. Target: within 1 s.

tests/e2e/test_dashboard_latency.py measures the API -> page part on every `make test`.

Usage: .venv/bin/python bench/stream_latency.py [--steps 60]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.e2e.browser import WATCH_LOSS_CHART, chromium_page, sign_in_by_default
from tests.services import Stack, postgres_database, redis_database
from tests.tiny import submit, tiny_plan, wait_for, write_corpus


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    with postgres_database() as pg, redis_database() as broker, tempfile.TemporaryDirectory() as home:
        home = Path(home)
        corpus = write_corpus(home / "data" / "corpus.txt")
        stack = Stack(home, pg, broker).start()  # home is under /tmp, an allowed root of the test stack
        try:
            stack.wait_worker_ready()
            sign_in_by_default(stack.url, stack.admin_token)
            with stack.client() as api, chromium_page() as page:
                run = submit(api, tiny_plan(), {"steps": args.steps, "data": {"path": str(corpus)}},
                             name="latency", approve=False)
                page.goto(f"{stack.url}/#/runs/{run['id']}")
                page.wait_for_function(
                    "document.querySelector('[data-testid=live-status]')?.dataset.live === 'open'", timeout=30_000)
                page.locator("[data-testid=loss-chart]").wait_for()
                page.evaluate(WATCH_LOSS_CHART)
                api.post(f"/api/runs/{run['id']}/approve").raise_for_status()
                print(f"run {run['id']}: {args.steps} steps, sp=2 on 2 CPU ranks; watching its page", flush=True)
                done = wait_for(api, run["id"], {"succeeded"}, timeout_s=600)
                page.wait_for_function("n => window.__arrivals.some(([p]) => p >= n)", arg=args.steps,
                                       timeout=30_000)
                arrivals = page.evaluate("window.__arrivals")
            written = {}
            for line in (home / "runs" / f"run-{done['id']}" / "metrics.jsonl").read_text().splitlines():
                if line.strip():
                    record = json.loads(line)
                    written.setdefault(record["step"], record["time"] * 1000)
        finally:
            stack.stop()
    latencies = []
    for step, t_written in sorted(written.items()):
        seen = next((t for n, t in arrivals if n >= step), None)
        if seen is not None:
            latencies.append(seen - t_written)
    lat = sorted(latencies)
    print(f"trainer write -> run page: {len(lat)} steps, median {statistics.median(lat):.0f} ms, "
          f"p90 {lat[int(0.9 * (len(lat) - 1))]:.0f} ms, max {lat[-1]:.0f} ms, "
          f"{sum(x <= 1000 for x in lat)}/{len(lat)} within 1 s (target: within 1 s)")


if __name__ == "__main__":
    main()
