"""Access: tokens and roles on every write endpoint, the browser's cookie session, path and size guards,
and approval checked against the estimate."""
import httpx
import pytest

from tests.tiny import submit, tiny_plan

OPEN_WRITES = {("post", "/api/session"), ("delete", "/api/session")}  # signing in and out need no token


def write_endpoints(api) -> list[tuple[str, str]]:
    schema = api.get("/openapi.json").json()
    return [(method, path.replace("{run_id}", "1").replace("{plan_id}", "1").replace("{token_id}", "1"))
            for path, ops in schema["paths"].items() for method in ops
            if method in ("post", "put", "patch", "delete") and (method, path) not in OPEN_WRITES]


def test_every_write_endpoint_refuses_a_missing_or_unknown_token(stack, api):
    endpoints = write_endpoints(api)
    assert len(endpoints) >= 10
    for method, path in endpoints:
        r = httpx.request(method, stack.url + path, json={})
        assert r.status_code == 401, (method, path, r.status_code)
        r = httpx.request(method, stack.url + path, json={}, headers={"Authorization": "Bearer ulab_wrong"})
        assert r.status_code == 401, (method, path, r.status_code)


def test_reads_are_closed_unless_a_setting_opens_them(stack):
    assert httpx.get(f"{stack.url}/api/runs").status_code == 401
    assert httpx.post(f"{stack.url}/api/estimate", json=tiny_plan()).status_code == 401


def test_roles(stack, api, corpus):
    viewer, submitter, other, approver, worker = (stack.client(r) for r in
                                                  ("viewer", "submitter", "submitter", "approver", "worker"))
    assert viewer.get("/api/runs").status_code == 200
    assert viewer.post("/api/plans", json=tiny_plan()).status_code == 403
    run = submit(submitter, tiny_plan(), {"steps": 3, "data": {"path": str(corpus)}}, approve=False)
    assert submitter.post(f"/api/runs/{run['id']}/approve").status_code == 403
    assert worker.post("/api/plans", json=tiny_plan()).status_code == 403
    assert worker.post(f"/api/runs/{run['id']}/metrics", json={"points": []}).status_code == 200
    assert submitter.post(f"/api/runs/{run['id']}/metrics", json={"points": []}).status_code == 403
    assert other.post(f"/api/runs/{run['id']}/cancel").status_code == 403  # not theirs
    assert approver.post("/api/tokens", json={"name": "x", "role": "admin"}).status_code == 403
    assert submitter.post(f"/api/runs/{run['id']}/cancel").json()["state"] == "cancelled"  # their own
    run2 = submit(submitter, tiny_plan(), {"steps": 3, "data": {"path": str(corpus)}}, approve=False)
    assert approver.post(f"/api/runs/{run2['id']}/cancel").status_code == 200  # approvers cancel any
    for c in (viewer, submitter, other, approver, worker):
        c.close()


def test_revoked_token_is_refused(stack, api):
    created = api.post("/api/tokens", json={"name": "short-lived", "role": "viewer"}).json()
    headers = {"Authorization": f"Bearer {created['token']}"}
    assert httpx.get(f"{stack.url}/api/runs", headers=headers).status_code == 200
    assert api.delete(f"/api/tokens/{created['id']}").json()["revoked_at"]
    assert httpx.get(f"{stack.url}/api/runs", headers=headers).status_code == 401
    listed = api.get("/api/tokens").json()
    assert all("token" not in t and "token_hash" not in t for t in listed)


def test_browser_session_cookie(stack):
    with httpx.Client(base_url=stack.url) as browser:
        assert browser.post("/api/session", json={"token": "ulab_nope"}).status_code == 401
        r = browser.post("/api/session", json={"token": stack.admin_token})
        assert r.status_code == 200 and r.json()["role"] == "admin"
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert browser.get("/api/session").json()["name"] == "tests"
        with browser.stream("GET", "/api/runs/1/stream" if browser.get("/api/runs/1").status_code == 200
                            else "/api/runs/999999/stream") as s:
            assert s.status_code in (200, 404)  # signed in: not 401
        browser.delete("/api/session")
        browser.cookies.clear()
        assert browser.get("/api/session").status_code == 401


@pytest.mark.parametrize("path", ["/etc/passwd", "../../../../etc/hostname", "/tmp/../etc/shadow"])
def test_paths_outside_the_allowed_roots_are_422(api, path):
    plan_id = api.post("/api/plans", json=tiny_plan()).json()["id"]
    r = api.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": path}}})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "run.data.path", r.text
    r = api.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": "/tmp/x.txt"}, "model_path": path}})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "run.model_path", r.text


def test_approval_checks_the_estimate_unless_forced(api, corpus):
    too_long = tiny_plan()
    big = {**too_long, "model": {"preset": "Qwen/Qwen3-32B"},
           "hardware": {"gpu": "A100-40GB", "gpus_per_node": 4}, "parallel": {"sp_size": 4, "dp_size": 1},
           "training": {**too_long["training"], "seq_len": 1 << 20, "dtype": "bf16", "zero_stage": 0}}
    run = submit(api, big, {"steps": 1, "data": {"path": str(corpus)}}, approve=False)
    assert run["estimate"]["memory"]["fits"] is False
    r = api.post(f"/api/runs/{run['id']}/approve")
    assert r.status_code == 409 and r.json()["detail"][0]["field"] == "estimate.memory"
    assert "GiB" in r.json()["detail"][0]["message"]
    r = api.post(f"/api/runs/{run['id']}/approve", params={"force": True})
    assert r.status_code == 200 and r.json()["forced"] is True and r.json()["state"] == "queued"
    api.post(f"/api/runs/{run['id']}/cancel")  # before the worker claims it, or soon after
