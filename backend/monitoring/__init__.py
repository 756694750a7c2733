"""Prometheus metrics of the service (GET /metrics): runs by state and queue and their queue wait (read from the
database at each scrape), and counters the API process keeps (points ingested, SSE clients, request latency by
route, re-sent and reaped runs)."""
