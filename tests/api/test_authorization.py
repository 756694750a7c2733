"""Who may call what: every route of the app against every role, with no token and with a wrong one.

The table below is the access contract (docs/api.md); a route added without a row here fails
`test_the_table_covers_every_route`, so no route ships without a decision about who may call it.
"""
from __future__ import annotations

import pytest

from backend.auth.roles import GRANTS, Permission, Role
from tests.api.conftest import ROLES, as_role
from tests.tiny import tiny_plan

P = Permission
OPEN = None  # no token needed
ATTEMPT = "attempt"  # only a live attempt's token (backend/execution/attempt_tokens.py): every API token gets a 401
ACCESS: dict[tuple[str, str], Permission | str | None] = {
    ("GET", "/api/health"): OPEN,
    ("GET", "/metrics"): P.READ,
    ("POST", "/api/session"): OPEN,
    ("DELETE", "/api/session"): OPEN,
    ("GET", "/api/session"): P.READ,
    ("POST", "/api/tokens"): P.ADMIN,
    ("GET", "/api/tokens"): P.ADMIN,
    ("DELETE", "/api/tokens/{token_id}"): P.ADMIN,
    ("GET", "/api/catalog"): P.READ,
    ("POST", "/api/estimate"): P.READ,
    ("POST", "/api/estimate/max-seq"): P.READ,
    ("POST", "/api/estimate/sweep"): P.READ,
    ("POST", "/api/estimate/export"): P.READ,
    ("POST", "/api/estimate/export.zip"): P.READ,
    ("POST", "/api/estimate/recommend"): P.READ,
    ("POST", "/api/estimate/fix"): P.READ,
    ("POST", "/api/estimate/sp-methods"): P.READ,
    ("GET", "/api/calibration"): P.READ,
    ("POST", "/api/calibration/estimate"): P.READ,
    ("POST", "/api/calibration/load"): P.ADMIN,
    ("GET", "/api/plans/defaults"): P.READ,
    ("POST", "/api/plans/effective"): P.READ,
    ("POST", "/api/plans/import"): P.READ,
    ("POST", "/api/plans"): P.SUBMIT,
    ("GET", "/api/plans"): P.READ,
    ("GET", "/api/plans/{plan_id}"): P.READ,
    ("POST", "/api/plans/{plan_id}/probe"): P.SUBMIT,
    ("GET", "/api/workers"): P.READ,
    ("POST", "/api/runs"): P.SUBMIT,
    ("GET", "/api/runs"): P.READ,
    ("GET", "/api/runs/{run_id}"): P.READ,
    ("GET", "/api/runs/{run_id}/checkpoints"): P.READ,
    ("GET", "/api/runs/{run_id}/checkpoints/{name}"): P.READ,
    ("GET", "/api/runs/{run_id}/events"): P.READ,
    ("PATCH", "/api/runs/{run_id}"): P.SUBMIT,
    ("POST", "/api/runs/{run_id}/approve"): P.APPROVE,
    ("POST", "/api/runs/{run_id}/cancel"): P.SUBMIT,
    ("POST", "/api/runs/{run_id}/retry"): P.APPROVE,
    ("GET", "/api/runs/{run_id}/log"): P.READ,
    ("GET", "/api/runs/{run_id}/log/download"): P.READ,
    ("GET", "/api/runs/{run_id}/fix"): P.READ,
    ("POST", "/api/runs/{run_id}/metrics"): P.INGEST,
    ("GET", "/api/runs/{run_id}/metrics/names"): P.READ,
    ("GET", "/api/runs/{run_id}/metrics/axes"): P.READ,
    ("GET", "/api/runs/{run_id}/metrics"): P.READ,
    ("GET", "/api/runs/{run_id}/metrics.csv"): P.READ,
    ("GET", "/api/runs/{run_id}/metrics.parquet"): P.READ,
    ("GET", "/api/runs/{run_id}/stream"): P.READ,
    ("POST", "/api/runs/{run_id}/share"): P.SUBMIT,
    ("GET", "/api/runs/{run_id}/share"): P.SUBMIT,
    ("DELETE", "/api/runs/{run_id}/share"): P.SUBMIT,
    ("POST", "/api/agent/v1/runs/{run_id}/claim"): P.AGENT,
    ("POST", "/api/agent/v1/runs/{run_id}/nodes/{node_rank}/claim"): P.AGENT,
    ("POST", "/api/agent/v1/workers/{hostname}/started"): P.AGENT,
    ("POST", "/api/agent/v1/workers/{hostname}/heartbeat"): P.AGENT,
    ("POST", "/api/agent/v1/workers/{hostname}/stopped"): P.AGENT,
    ("POST", "/api/agent/v1/runs/{run_id}/attempts/{attempt}/start"): ATTEMPT,
    ("POST", "/api/agent/v1/runs/{run_id}/attempts/{attempt}/heartbeat"): ATTEMPT,
    ("POST", "/api/agent/v1/runs/{run_id}/attempts/{attempt}/finish"): ATTEMPT,
    ("POST", "/api/agent/v1/runs/{run_id}/attempts/{attempt}/nodes/0"): ATTEMPT,
    ("GET", "/api/agent/v1/runs/{run_id}/attempts/{attempt}/endpoint"): ATTEMPT,
    ("POST", "/api/agent/v1/runs/{run_id}/attempts/{attempt}/nodes/{node_rank}/heartbeat"): ATTEMPT,
    ("POST", "/api/agent/v1/runs/{run_id}/attempts/{attempt}/nodes/{node_rank}/exit"): ATTEMPT,
    ("POST", "/api/agent/v1/runs/{run_id}/attempts/{attempt}/trainer-stopped"): ATTEMPT,
    ("POST", "/api/agent/v1/runs/{run_id}/jobs/{job_id}/heartbeat"): ATTEMPT,
    ("GET", "/api/agent/v1/runs/{run_id}/stored"): ATTEMPT,
}
# A body that passes validation where one is needed, so an allowed role reaches the route's own code.
BODIES = {"/api/estimate": tiny_plan(), "/api/estimate/max-seq": tiny_plan(), "/api/estimate/export": tiny_plan(),
          "/api/estimate/export.zip": tiny_plan() | {"run": {"data": {"path": "x.txt"}}},
          "/api/estimate/sweep": {"plan": tiny_plan()}, "/api/plans/effective": tiny_plan(),
          "/api/plans": tiny_plan(), "/api/tokens": {"name": "x", "role": "viewer"},
          "/api/runs/{run_id}/metrics": {"points": []}, "/api/estimate/recommend": {"plan": tiny_plan()},
          "/api/estimate/fix": tiny_plan(), "/api/estimate/sp-methods": tiny_plan(),
          "/api/calibration/estimate": tiny_plan(), "/api/plans/import": {"ds_config": "{}"},
          "/api/agent/v1/runs/{run_id}/claim": {"worker": "w"},
          "/api/agent/v1/runs/{run_id}/nodes/{node_rank}/claim": {"worker": "w"},
          "/api/agent/v1/workers/{hostname}/started": {"queues": [], "capabilities": {}}}


def api_routes(app) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops}


def test_the_table_covers_every_route(app):
    assert api_routes(app) == set(ACCESS)


def _call(client, method: str, path: str, headers: dict):
    url = path
    for slot, value in (("{run_id}", "999999"), ("{plan_id}", "999999"), ("{token_id}", "999999"),
                        ("{attempt}", "1"), ("{node_rank}", "1"), ("{hostname}", "host"), ("{job_id}", "7")):
        url = url.replace(slot, value)
    body = BODIES.get(path)
    if path.endswith("/metrics") and method == "GET":
        url += "?name=loss"
    return client.request(method, url, json=body, headers=headers)


@pytest.mark.parametrize("route", sorted(ACCESS), ids=lambda r: f"{r[0]} {r[1]}")
def test_each_role_gets_exactly_what_its_grants_say(client, tokens, route):
    method, path = route
    need = ACCESS[route]
    if need is OPEN:
        return
    assert _call(client, method, path, {}).status_code == 401
    assert _call(client, method, path, {"Authorization": "Bearer ulab_wrong"}).status_code == 401
    for role in ROLES:
        status = _call(client, method, path, as_role(client, tokens, role)).status_code
        if need == ATTEMPT:
            assert status == 401, (role, route, status)
        elif need in GRANTS[Role(role)]:
            assert status not in (401, 403), (role, route, status)
        else:
            assert status == 403, (role, route, status)


def test_a_submitter_cancels_only_their_own_runs(client, tokens, tmp_path):
    data = tmp_path / "d.txt"
    data.write_text("x " * 2000)
    mine, approver = as_role(client, tokens, "submitter"), as_role(client, tokens, "approver")
    other = {"Authorization": f"Bearer {_second_submitter()}"}
    plan_id = client.post("/api/plans", json=tiny_plan(), headers=mine).json()["id"]

    def submit(headers):
        r = client.post("/api/runs", json={"plan_id": plan_id, "run": {"steps": 3, "data": {"path": str(data)}}},
                        headers=headers)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    run = submit(mine)
    assert client.post(f"/api/runs/{run}/cancel", headers=other).status_code == 403  # not theirs
    assert client.post(f"/api/runs/{run}/cancel", headers=mine).json()["state"] == "cancelled"  # their own
    run2 = submit(mine)
    assert client.post(f"/api/runs/{run2}/cancel", headers=approver).status_code == 200  # approvers cancel any


def _second_submitter() -> str:
    from backend.auth.service import create_token
    from backend.core.db import get_sessionmaker

    with get_sessionmaker()() as session:
        return create_token(session, "another submitter", Role.SUBMITTER)[1]


def test_revoked_token_is_refused(client, tokens):
    admin = as_role(client, tokens, "admin")
    created = client.post("/api/tokens", json={"name": "short-lived", "role": "viewer"}, headers=admin).json()
    headers = {"Authorization": f"Bearer {created['token']}"}
    assert client.get("/api/runs", headers=headers).status_code == 200
    assert client.delete(f"/api/tokens/{created['id']}", headers=admin).json()["revoked_at"]
    assert client.get("/api/runs", headers=headers).status_code == 401
    listed = client.get("/api/tokens", headers=admin).json()
    assert all("token" not in t and "token_hash" not in t for t in listed)


@pytest.mark.parametrize("path", ["/etc/passwd", "../../../../etc/hostname", "/tmp/../etc/shadow"])
def test_paths_outside_the_allowed_roots_are_422(client, tokens, path, tmp_path):
    admin = as_role(client, tokens, "admin")
    plan_id = client.post("/api/plans", json=tiny_plan(), headers=admin).json()["id"]
    r = client.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": path}}}, headers=admin)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "run.data.path", r.text
    ok = tmp_path / "x.txt"
    ok.write_text("x")
    r = client.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": str(ok)}, "model_path": path}},
                    headers=admin)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "run.model_path", r.text
