"""Tokens: only the token of a run's claimed attempt writes its metrics (a worker's own token writes none), and no run
takes writes a minute after it ended; a kept worker token is reused across starts; sign-out revokes the cookie's
session token."""
from __future__ import annotations

from datetime import timedelta

from fastapi.testclient import TestClient

from backend.auth.roles import Role
from backend.core.db import get_sessionmaker, session_scope
from backend.core.settings import Settings
from backend.execution.agent import Claim, HttpRunAgent
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.states import RunState
from tests.api.conftest import WORKER_QUEUE, as_role
from tests.tiny import tiny_plan

POINTS = {"points": [{"rank": 0, "step": 1, "name": "loss", "value": 2.5, "wall_time": 0.0}]}


def new_token(role: Role) -> tuple[str, int]:
    from backend.auth.service import create_token

    with get_sessionmaker()() as session:
        row, token = create_token(session, f"scope test {role}", role, [WORKER_QUEUE] if role == Role.WORKER else None)
        return token, row.id


def queued_run(client, tokens, tmp_path) -> int:
    admin = as_role(client, tokens, "admin")
    data = tmp_path / "d.txt"
    data.write_text("x\n")
    plan_id = client.post("/api/plans", json=tiny_plan(), headers=admin).json()["id"]
    run_id = client.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": str(data)}}},
                         headers=admin).json()["id"]
    assert client.post(f"/api/runs/{run_id}/approve", headers=admin).status_code == 200
    return run_id


def write(client, run_id: int, token: str):
    return client.post(f"/api/runs/{run_id}/metrics", json=POINTS, headers={"Authorization": f"Bearer {token}"})


def claimed(client, token: str, run_id: int) -> Claim:
    claim = HttpRunAgent(Settings(worker_token=token), client=client).claim(run_id, "w:1")
    assert claim is not None
    return claim


def test_only_the_claimed_attempts_token_writes_its_metrics(client, tokens, tmp_path):
    mine, _ = new_token(Role.WORKER)
    other, _ = new_token(Role.WORKER)
    run_id = queued_run(client, tokens, tmp_path)
    assert write(client, run_id, mine).status_code == 403  # a worker's own token writes no metrics
    attempt = claimed(client, mine, run_id).token
    for token in (other, mine, claimed(client, other, queued_run(client, tokens, tmp_path)).token):
        r = write(client, run_id, token)
        assert r.status_code == 403, r.text
        assert r.json()["detail"][0]["field"] == "authorization", r.text
    assert write(client, run_id, attempt).json() == {"accepted": 1}
    assert write(client, run_id, tokens["admin"]).status_code == 200  # an admin is not a worker


def test_no_writes_a_minute_after_the_run_ended(client, tokens, tmp_path):
    worker, _ = new_token(Role.WORKER)
    run_id = queued_run(client, tokens, tmp_path)
    attempt = claimed(client, worker, run_id).token
    assert transitions.finish(run_id, 1, RunState.SUCCEEDED, None)
    assert write(client, run_id, attempt).status_code == 200  # the worker drains its last lines
    with session_scope() as s:
        ended = s.get_one(Run, run_id)
        ended.finished_at = transitions.as_utc(ended.finished_at) - timedelta(seconds=61)
    r = write(client, run_id, tokens["admin"])
    assert r.status_code == 409, r.text
    assert r.json()["detail"][0]["field"] == "state", r.text
    r = write(client, run_id, attempt)  # the attempt's token expired with it
    assert r.status_code == 401, r.text
    assert r.json()["detail"][0]["field"] == "authorization", r.text


def test_a_kept_worker_token_is_reused_across_starts(app_env, tmp_path):
    from backend.auth.service import revoke, token_in_file

    path = tmp_path / "home" / "worker-token"
    with get_sessionmaker()() as session:
        first, p1 = token_in_file(session, path, "w", Role.WORKER, [WORKER_QUEUE])
        again, p2 = token_in_file(session, path, "w", Role.WORKER, [WORKER_QUEUE])
        assert again == first
        assert p1.token_id == p2.token_id
        assert (p1.role, p1.queues) == (Role.WORKER, frozenset({WORKER_QUEUE}))
        assert path.stat().st_mode & 0o777 == 0o600
        assert p1.token_id is not None
        revoke(session, p1.token_id)
        fresh, p3 = token_in_file(session, path, "w", Role.WORKER, [WORKER_QUEUE])  # a revoked one is replaced
        assert fresh != first
        assert p3.token_id != p1.token_id
        wider, p4 = token_in_file(session, path, "w", Role.WORKER, [WORKER_QUEUE, "gpu-a100-80gb"])
        assert wider != fresh  # another scope is another token
        assert p4.queues == frozenset({WORKER_QUEUE, "gpu-a100-80gb"})


def test_sign_out_revokes_the_cookie_token(app, tokens):
    viewer, viewer_id = new_token(Role.VIEWER)
    browser = TestClient(app)  # its own cookie jar
    r = browser.post("/api/session", json={"token": viewer})
    assert r.status_code == 200
    assert r.json()["token_id"] == viewer_id  # the session acts as the token given
    cookie = browser.cookies["ulab_token"]
    assert cookie != viewer
    assert browser.get("/api/session").json()["token_id"] == viewer_id
    assert browser.delete("/api/session").status_code == 204
    fresh = TestClient(app)
    assert fresh.get("/api/runs", headers={"Authorization": f"Bearer {cookie}"}).status_code == 401
    assert fresh.get("/api/runs", headers={"Authorization": f"Bearer {viewer}"}).status_code == 200  # still valid
    # revoking the token also ends the sessions opened with it
    r = fresh.post("/api/session", json={"token": viewer})
    second = r.cookies["ulab_token"]
    admin = as_role(fresh, tokens, "admin")
    assert fresh.delete(f"/api/tokens/{viewer_id}", headers=admin).status_code == 200
    assert fresh.get("/api/runs", headers={"Authorization": f"Bearer {second}"}).status_code == 401


def test_an_idempotency_key_makes_one_run_of_two_identical_submits(client, tokens, tmp_path):
    data = tmp_path / "d.txt"
    data.write_text("x\n")
    mine = as_role(client, tokens, "submitter")
    plan_id = client.post("/api/plans", json=tiny_plan(), headers=mine).json()["id"]
    body = {"plan_id": plan_id, "run": {"data": {"path": str(data)}}}
    keyed = {**mine, "Idempotency-Key": "submit-7f3a"}
    first = client.post("/api/runs", json=body, headers=keyed)
    again = client.post("/api/runs", json=body, headers=keyed)
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    other_plan = client.post("/api/plans", json=tiny_plan(seq_len=1024), headers=mine).json()["id"]
    r = client.post("/api/runs", json={**body, "plan_id": other_plan}, headers=keyed)
    assert r.status_code == 409, r.text
    assert r.json()["detail"][0]["field"] == "idempotency-key", r.text
    # the same plan with another run section is another submit: refused, not answered with the first run
    r = client.post("/api/runs", json={**body, "run": {**body["run"], "steps": 7}}, headers=keyed)
    assert r.status_code == 409, r.text
    assert "with another request body" in r.json()["detail"][0]["message"], r.text
    # another token's key space is its own, and no key means a new run each time
    theirs = client.post("/api/runs", json=body, headers={**as_role(client, tokens, "approver"),
                                                         "Idempotency-Key": "submit-7f3a"})
    assert theirs.json()["id"] != first.json()["id"]
    assert client.post("/api/runs", json=body, headers=mine).json()["id"] != first.json()["id"]


def test_a_session_token_expires_with_its_cookie_and_is_purged(app, tokens):
    from datetime import UTC, datetime

    from sqlalchemy import select

    from backend.auth import service
    from backend.auth.models import ApiToken
    from backend.core.db import get_sessionmaker

    viewer, viewer_id = new_token(Role.VIEWER)
    browser = TestClient(app)
    assert browser.post("/api/session", json={"token": viewer}).status_code == 200
    cookie = browser.cookies["ulab_token"]
    fresh = TestClient(app)
    assert fresh.get("/api/runs", headers={"Authorization": f"Bearer {cookie}"}).status_code == 200
    with get_sessionmaker()() as session:
        row = session.scalar(select(ApiToken).where(ApiToken.token_hash == service.hash_token(cookie)))
        row.created_at = datetime.now(UTC) - timedelta(seconds=service.SESSION_TTL_S + 60)
        session.commit()
        service._verified.clear()  # the 5-s cache of verified tokens
        assert fresh.get("/api/runs", headers={"Authorization": f"Bearer {cookie}"}).status_code == 401
        assert fresh.get("/api/runs", headers={"Authorization": f"Bearer {viewer}"}).status_code == 200
        assert service.purge_sessions(session) >= 1
        assert session.scalar(select(ApiToken).where(ApiToken.token_hash == service.hash_token(cookie))) is None
        assert session.get(ApiToken, viewer_id) is not None  # the token itself is not a session: kept
