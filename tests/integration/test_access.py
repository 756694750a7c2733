"""Access against the real stack: the browser's cookie session and approval checked against the estimate.
(Who may call which route is checked in-process: tests/api/test_authorization.py.)"""
import httpx

from tests.checkpoints import save_preset_config
from tests.tiny import submit, tiny_plan


def test_browser_session_cookie(stack):
    with httpx.Client(base_url=stack.url) as browser:
        assert browser.post("/api/session", json={"token": "ulab_nope"}).status_code == 401
        r = browser.post("/api/session", json={"token": stack.admin_token})
        assert r.status_code == 200
        assert r.json()["role"] == "admin"
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        assert browser.get("/api/session").json()["name"] == "tests"
        with browser.stream("GET", "/api/runs/1/stream" if browser.get("/api/runs/1").status_code == 200
                            else "/api/runs/999999/stream") as s:
            assert s.status_code in (200, 404)  # signed in: not 401
        browser.delete("/api/session")
        browser.cookies.clear()
        assert browser.get("/api/session").status_code == 401


def test_approval_checks_the_estimate_unless_forced(stack, api, corpus):
    # a checkpoint of the preset's architecture (config.json only) under the models root: approval checks it
    checkpoint = str(save_preset_config(stack.home / "models" / "Qwen3-32B-config", "Qwen/Qwen3-32B"))
    too_long = tiny_plan()
    big = {**too_long, "model": {"preset": "Qwen/Qwen3-32B"},
           "hardware": {"gpu": "A100-40GB", "gpus_per_node": 4}, "parallel": {"sp_size": 4, "dp_size": 1},
           "training": {**too_long["training"], "seq_len": 1 << 20, "dtype": "bf16", "zero_stage": 0}}
    run = submit(api, big, {"steps": 1, "data": {"path": str(corpus)}, "model_path": checkpoint},
                 approve=False)
    assert run["estimate"]["memory"]["fits"] is False
    r = api.post(f"/api/runs/{run['id']}/approve")
    assert r.status_code == 409
    assert r.json()["detail"][0]["field"] == "estimate.memory"
    assert "GiB" in r.json()["detail"][0]["message"]
    # 7,200 GiB per GPU: past what even a forced run may ask for (ULAB_MAX_FORCED_GIB_PER_GPU, 1 TiB)
    r = api.post(f"/api/runs/{run['id']}/approve", params={"force": True})
    assert r.status_code == 409, r.text
    assert "ULAB_MAX_FORCED_GIB_PER_GPU" in r.json()["detail"][0]["message"], r.text
    # 541 GiB per GPU (seq_len 8192): does not fit a 40 GB GPU, but may be forced
    big["training"]["seq_len"] = 8192
    run = submit(api, big, {"steps": 1, "data": {"path": str(corpus)}, "model_path": checkpoint},
                 approve=False)
    assert api.post(f"/api/runs/{run['id']}/approve").status_code == 409
    r = api.post(f"/api/runs/{run['id']}/approve", params={"force": True})
    assert r.status_code == 200
    assert r.json()["forced"] is True
    assert r.json()["state"] == "queued"
    api.post(f"/api/runs/{run['id']}/cancel")  # before the worker claims it, or soon after
