"""GET /metrics (Prometheus): scraped while a run is running, it counts the points ingested, the run by state and
queue, its queue wait, request latency by route template, and the reaper's and re-send's counts."""
from __future__ import annotations

from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import as_role
from tests.api.test_alerts import ingest, loss_points, running_run


def scrape(client, headers) -> dict[tuple[str, tuple], float]:
    r = client.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_scraped_during_a_run(client, tokens, tmp_path):
    admin, viewer = as_role(client, tokens, "admin"), as_role(client, tokens, "viewer")
    assert client.get("/metrics").status_code == 401  # protected like the other reads
    run_id = running_run(client, admin, tmp_path)
    before = scrape(client, viewer)
    ingest(client, admin, run_id, loss_points({s: 5.0 for s in range(1, 13)}))
    after = scrape(client, viewer)
    assert value(after, "ulab_metric_points_ingested_total") - value(before, "ulab_metric_points_ingested_total") == 12
    queue = "gpu-h100-80gb"  # tiny_plan's GPU (the run trains on CPU ranks in tests)
    assert value(after, "ulab_runs", state="running", queue=queue) >= 1
    assert value(after, "ulab_queue_wait_seconds_count") >= 1  # the run was queued, then started
    route = dict(method="POST", route="/api/runs/{run_id}/metrics", status="200")
    assert value(after, "ulab_http_request_duration_seconds_count", **route) - \
        value(before, "ulab_http_request_duration_seconds_count", **route) == 1


def test_reaper_and_resend_counters(client, tokens, tmp_path):
    from backend.core.db import session_scope
    from backend.execution import reaper as lifecycle
    from backend.runs import transitions
    from backend.runs.models import Run

    admin, viewer = as_role(client, tokens, "admin"), as_role(client, tokens, "viewer")
    before = scrape(client, viewer)
    lost = running_run(client, admin, tmp_path)
    with session_scope() as s:
        s.get(Run, lost).heartbeat_at = transitions.now() - timedelta(hours=1)
    assert lost in lifecycle.reap_lost(60)
    plan_id = client.post("/api/plans", json=client.get(f"/api/runs/{lost}", headers=admin).json()["spec"],
                          headers=admin).json()["id"]
    data = tmp_path / "d.txt"
    queued = client.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": str(data)}}},
                         headers=admin).json()["id"]
    client.post(f"/api/runs/{queued}/approve", headers=admin)
    assert queued in lifecycle.resend_queued()
    after = scrape(client, viewer)
    assert value(after, "ulab_runs_reaped_total") - value(before, "ulab_runs_reaped_total") == 1
    assert value(after, "ulab_runs_resent_total") - value(before, "ulab_runs_resent_total") >= 1
    assert value(after, "ulab_queue_oldest_wait_seconds", queue="gpu-h100-80gb") >= 0
    assert ("ulab_queue_oldest_wait_seconds", (("queue", "gpu-h100-80gb"),)) in after
