"""GET /metrics of the real stack (uvicorn, PostgreSQL, the Celery worker), scraped after the shared trained run and
while a browser-like client follows its live stream: what Prometheus (docker-compose.yml) would read."""
from __future__ import annotations

import json
import time

from prometheus_client.parser import text_string_to_metric_families


def scrape(api) -> dict[tuple[str, tuple], float]:
    r = api.get("/metrics")
    assert r.status_code == 200, r.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def sse_clients(api) -> float:
    return scrape(api).get(("ulab_sse_clients", ()), 0.0)


def test_the_stack_is_scraped_with_a_stream_open(api, trained_run):
    samples = scrape(api)
    assert samples[("ulab_runs", (("queue", "gpu-h100-80gb"), ("state", "succeeded")))] >= 1
    assert samples[("ulab_metric_points_ingested_total", ())] > 0  # the run's points, shipped by the worker
    assert samples[("ulab_queue_wait_seconds_count", ())] >= 1
    ingest = (("method", "POST"), ("route", "/api/runs/{run_id}/metrics"), ("status", "200"))
    assert samples[("ulab_http_request_duration_seconds_count", ingest)] >= 1
    idle = sse_clients(api)
    with api.stream("GET", f"/api/runs/{trained_run['id']}/stream") as stream:
        lines = stream.iter_lines()  # kept: a dropped iterator closes the response
        assert next(lines) == "event: state"  # connected: the first event has come
        assert sse_clients(api) == idle + 1
    deadline = time.monotonic() + 10
    while sse_clients(api) != idle and time.monotonic() < deadline:  # the server sees the disconnect
        time.sleep(0.1)
    assert sse_clients(api) == idle


def test_the_worker_mirrors_the_trained_run_to_tensorboard(stack, api, trained_run):
    """The shared trained run asks for `report_to: ["tensorboard"]`: the worker that ran it forwards what the API
    stored, every step once, in order, and marks the tracker done once the final state went."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.conftest import TRAINED_STEPS

    run_dir = stack.home / "runs" / f"run-{trained_run['id']}"
    state = run_dir / "trackers.json"
    deadline = time.monotonic() + 60
    while not (state.is_file() and json.loads(state.read_text())["tensorboard"]["done"]):
        assert time.monotonic() < deadline, state.read_text() if state.is_file() else "no trackers.json"
        time.sleep(0.2)
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    assert [e.step for e in acc.Tensors("loss")] == list(range(1, TRAINED_STEPS + 1))
    stored = api.get(f"/api/runs/{trained_run['id']}/metrics", params={"name": "loss"}).json()["series"][0]
    assert stored["step"] == list(range(1, TRAINED_STEPS + 1))
