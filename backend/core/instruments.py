"""The counters and gauges the API process updates as it works (prometheus-client). With several API processes
(`ulab serve --workers N`), `ulab serve` points PROMETHEUS_MULTIPROC_DIR at a directory before they start, and the
scrape sums every process's files (prometheus_client.multiprocess)."""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

POINTS_INGESTED = Counter("ulab_metric_points_ingested", "Metric points stored by POST /api/runs/{id}/metrics "
                                                         "(rate() of it: points ingested per second)")
SSE_CLIENTS = Gauge("ulab_sse_clients", "Browsers connected to a run's live stream (Server-Sent Events)",
                    multiprocess_mode="livesum")
# Buckets from a 1 ms estimate to a 30 s chart query over a very long run.
REQUEST_SECONDS = Histogram("ulab_http_request_duration_seconds", "HTTP request latency by route template",
                            ["method", "route", "status"],
                            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
RUNS_RESENT = Counter("ulab_runs_resent", "Queued runs whose message was sent to the broker again (the supervision "
                                          "loop: at start-up, and runs unclaimed past ULAB_RESEND_AFTER_S)")
RUNS_REAPED = Counter("ulab_runs_reaped", "Runs marked lost because their heartbeat stopped (the reaper)")
