"""End to end without a browser: plan -> approve -> Celery worker -> torchrun (2 CPU ranks) -> metrics in the API."""
import os

import httpx
import pytest

from backend.auth.service import hash_token
from tests.services import Stack
from tests.tiny import environ, submit, tiny_plan, wait_for

pytestmark = pytest.mark.slow


def loss_points(api: httpx.Client, run_id: int) -> list[float]:
    q = api.get(f"/api/runs/{run_id}/metrics", params={"name": "loss", "points": 1000}).json()
    return q["series"][0]["last"] if q["series"] else []


def test_run_trains_on_redis_and_postgres(api, trained_run):
    run = trained_run
    assert run["state"] == "succeeded"
    assert run["worker"]
    assert run["exit_reason"] is None
    assert run["last_step"] == run["steps"] == 12
    losses = loss_points(api, run["id"])
    assert len(losses) >= 10
    assert losses[-1] < losses[0]
    mem = api.get(f"/api/runs/{run['id']}/metrics", params={"name": "peak_allocated_gib"}).json()["series"]
    assert [s["rank"] for s in mem] == [0, 1]
    assert all(v > 0 for s in mem for v in s["last"])
    names = api.get(f"/api/runs/{run['id']}/metrics/names").json()
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "seq_len"} <= set(names)
    log = api.get(f"/api/runs/{run['id']}/log").json()["lines"]
    assert log, "the trainer's output is readable through the API"


def test_the_worker_holds_no_database_url_and_its_token_reads_and_writes_no_run(stack, trained_run, pg_url):
    """The worker trained the run over HTTP alone: no database URL in its environment, its own token (recorded on
    the run it claimed) reads no run and writes no metrics; the run's metrics went in with its attempt's token."""
    import sqlalchemy as sa

    env = environ(stack.worker.proc.pid)
    assert "ULAB_DATABASE_URL" not in env
    token = env["ULAB_WORKER_TOKEN"]
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as c:
            claimed = c.execute(sa.text("SELECT t.queues FROM runs r JOIN api_tokens t ON t.id = r.claimed_token_id "
                                        "WHERE r.id = :i AND t.token_hash = :h"),
                                {"i": trained_run["id"], "h": hash_token(token)}).scalar_one()
            attempt_tokens = c.execute(sa.text("SELECT count(*) FROM attempt_tokens WHERE run_id = :i"),
                                       {"i": trained_run["id"]}).scalar_one()
            # the run ended a while ago (its metrics close a minute after the end): open it again for the check
            c.execute(sa.text("UPDATE runs SET finished_at = now() WHERE id = :i"), {"i": trained_run["id"]})
            c.commit()
    finally:
        engine.dispose()
    assert claimed == "gpu-h100-80gb"
    assert attempt_tokens == 1
    point = {"points": [{"step": 1, "rank": 0, "name": "scope_probe", "value": 1.0}]}  # not a series others read
    for worker_token in (token, stack.token("worker")):
        headers = {"Authorization": f"Bearer {worker_token}"}
        r = httpx.post(f"{stack.url}/api/runs/{trained_run['id']}/metrics", json=point, headers=headers, timeout=30)
        assert r.status_code == 403, r.text
        for path in ("/api/runs", f"/api/runs/{trained_run['id']}", f"/api/runs/{trained_run['id']}/log"):
            assert httpx.get(f"{stack.url}{path}", headers=headers, timeout=30).status_code == 403, path


def test_same_flow_on_embedded_defaults(tmp_path, corpus):
    """SQLite database and kombu's SQLAlchemy broker transport: what `make run` starts."""
    s = Stack(tmp_path / "embedded", database_url="", broker_url="").start()
    try:
        assert not os.environ.get("ULAB_DATABASE_URL")
        with s.client() as api:
            run = submit(api, tiny_plan(sp_size=1), {"steps": 10, "data": {"path": str(corpus)}}, name="embedded")
            run = wait_for(api, run["id"], {"succeeded"}, timeout_s=300)
            assert len(loss_points(api, run["id"])) >= 10
        assert (tmp_path / "embedded" / "ulab.db").is_file()
        assert (tmp_path / "embedded" / "broker.db").is_file()
    finally:
        s.stop()


def test_the_worker_reported_what_it_can_run(api, trained_run):
    """At start the Celery worker reported its versions, kernels and GPU (none here); worker/trainer/capabilities.py; it
    trained a run since, so it has started."""
    import torch

    workers = [w for w in api.get("/api/workers").json() if "gpu-h100-80gb" in w["queues"] and not w["stopped_at"]]
    assert workers, api.get("/api/workers").text
    w = workers[0]
    assert w["versions"]["torch"] == torch.__version__
    assert w["versions"]["deepspeed"]
    assert w["gpu_model"] is None
    assert w["gpu_count"] == 0
    assert "sdpa" in w["attn_implementations"]
