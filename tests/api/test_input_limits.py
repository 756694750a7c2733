"""Input hardening: a request the database or the planner cannot take is a 4xx naming the
field, never a 500 and never a stored row that breaks later reads. Real PostgreSQL: tests/integration/test_hardening.py.
"""
from __future__ import annotations

import json

import pytest

from tests.api.conftest import as_role
from tests.tiny import tiny_plan

PLANNER_ROUTES = ["/api/estimate", "/api/estimate/max-seq", "/api/estimate/export", "/api/plans"]


def raw(client, path: str, body: str, headers: dict):
    """POST a body exactly as written (the JSON encoder of a client would refuse some of them)."""
    return client.post(path, content=body.encode(), headers={**headers, "content-type": "application/json"})


def with_config(extra: str) -> str:
    """The tiny plan with `extra` spliced into model.config as JSON text."""
    return json.dumps(tiny_plan()).replace('"vocab_size": 512', f'"vocab_size": 512, {extra}')


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def count_plans(client, headers) -> int:
    r = client.get("/api/plans", headers=headers, params={"limit": 1000})
    assert r.status_code == 200, r.text
    return len(r.json())


@pytest.mark.parametrize("where", ["config", "name", "key"])
def test_a_lone_surrogate_is_a_422_naming_the_field_and_nothing_is_stored(client, tokens, where):
    headers = as_role(client, tokens, "submitter")
    before = count_plans(client, headers)
    body = {"config": with_config('"note": "\\ud800"'),
            "name": json.dumps({**tiny_plan(), "name": "\udfff"}),
            "key": with_config('"\\ud800x": 1')}[where]
    r = raw(client, "/api/plans", body, headers)
    assert r.status_code == 422, r.text
    field = r.json()["detail"][0]["field"]
    assert field == {"config": "model.config.note", "name": "name", "key": "model.config"}[where]
    assert "UTF-8" in r.json()["detail"][0]["message"]
    assert count_plans(client, headers) == before
    for path in ("/api/plans", "/api/runs", "/api/runs?state=queued,running"):
        assert client.get(path, headers=headers).status_code == 200


@pytest.mark.parametrize("path", PLANNER_ROUTES)
@pytest.mark.parametrize("case", ["inf", "nan", "deep500", "deep900"])
def test_planner_inputs_that_crashed_are_422s(client, tokens, path, case):
    body = {"inf": with_config('"rope_theta": 1e999').replace('"hidden_size": 64', '"hidden_size": 1e999'),
            "nan": with_config('"x": NaN'),
            "deep500": with_config(f'"deep": {nested(500)}'),
            "deep900": with_config(f'"deep": {nested(900)}')}[case]
    r = raw(client, path, body, as_role(client, tokens, "submitter"))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["field"].startswith({"inf": "model.config.", "nan": "model.config.x",
                                       "deep500": "model.config.deep.a", "deep900": "model.config.deep.a"}[case])
    assert ("finite" if case in ("inf", "nan") else "nested deeper than 32") in detail["message"]


def test_huge_sizes_and_gpu_figures_are_answered_not_raised(client, tokens):
    """What the plan model already bounds (config sizes, custom GPU figures) stays a 4xx or an invalid estimate."""
    headers = as_role(client, tokens, "submitter")
    huge = json.dumps(tiny_plan()).replace('"hidden_size": 64', '"hidden_size": 1' + "0" * 400)
    gpu = tiny_plan()
    gpu["hardware"]["gpu"] = {k: 1e308 for k in ("memory_gib", "hbm_tb_per_s", "bf16_dense_tflops",
                                                 "nvlink_gb_per_s_per_direction", "typical_internode_gb_per_s")}
    for path in PLANNER_ROUTES:
        r = raw(client, path, huge, headers)
        assert r.status_code in (200, 422), r.text
        errors = r.json().get("errors") or r.json().get("estimate", {}).get("errors") or r.json().get("detail")
        assert errors[0]["field"] == "model.config.hidden_size"
        r = client.post(path, json=gpu, headers=headers)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["field"].startswith("hardware.gpu."), r.text


def test_the_plan_model_refuses_an_infinite_size_itself():
    """`ulab plan` reads files without the API's body check: the planner answers an error, not OverflowError."""
    import plan as planner

    p = tiny_plan()
    p["model"]["config"]["hidden_size"] = float("inf")
    v = planner.validate(p)
    assert v.errors
    assert v.errors[0]["field"] == "model.config.hidden_size"


def test_body_size_limits(client, tokens):
    headers = as_role(client, tokens, "submitter")
    before = count_plans(client, headers)
    big = with_config('"pad": "' + "a" * (1024 * 1024) + '"')
    r = raw(client, "/api/plans", big, headers)
    assert r.status_code == 413, r.text
    assert r.json()["detail"][0]["field"] == "body", r.text
    assert count_plans(client, headers) == before
    # metric batches have their own, larger limit: a 2 MB batch reaches the route (unknown run: 404)
    points = [{"rank": 0, "step": i, "name": "loss", "value": 1.0, "wall_time": 0.0} for i in range(1, 30_000)]
    body = json.dumps({"points": points})
    assert len(body) > 1024 * 1024
    r = raw(client, "/api/runs/999999/metrics", body, as_role(client, tokens, "worker"))
    assert r.status_code != 413, r.text
    # a batch is checked by its typed schema, not the body walk: still a 4xx for each hostile value
    worker = as_role(client, tokens, "worker")
    point = '{"points": [{"rank": 0, "step": 1, "name": %s, "value": %s}]}'
    for body in (point % ('"\\ud800"', "1.0"), point % ('"loss"', "1e999"), point % ('"loss"', "NaN"),
                 '{"points": ' + nested(3000) + "}"):
        r = raw(client, "/api/runs/999999/metrics", body, worker)
        assert 400 <= r.status_code < 500, (body[:80], r.text)


def test_the_session_refuses_to_write_an_unreadable_value(app_env):
    """Writers other than the API (the CLI, the worker) go through the same check, in the session."""
    from backend.core.db import get_sessionmaker
    from backend.core.text import UnstorableValue
    from backend.plans.models import Plan

    with get_sessionmaker()() as session:
        session.add(Plan(name="x", spec={"model": {"config": {"note": "\ud800"}}}, estimate={}))
        with pytest.raises(UnstorableValue) as err:
            session.commit()
        assert err.value.field == "plans.spec.model.config.note"
        session.rollback()
        session.add(Plan(name="y", spec={}, estimate={"memory": {"gib": float("nan")}}))
        with pytest.raises(UnstorableValue, match="finite"):
            session.commit()


def test_security_headers(client, tokens):
    """The dashboard's pages get a CSP; every answer (a 413 from the body limits too) nosniff and no framing."""
    page = client.get("/")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert "script-src 'self'" in page.headers["content-security-policy"]
    big = raw(client, "/api/plans", with_config('"pad": "' + "a" * (1024 * 1024) + '"'),
              as_role(client, tokens, "submitter"))
    for r in (page, client.get("/api/health"), client.get("/docs"), big):
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"
    assert "content-security-policy" not in client.get("/docs").headers  # Swagger UI comes from a CDN


def test_a_server_error_carries_the_security_headers(app_env):
    """A 500 (an unhandled exception) is answered by Starlette's error middleware, which used to sit outside the
    headers middleware: its answer came without them."""
    from fastapi.testclient import TestClient

    from backend.main import create_app

    app = create_app()

    @app.get("/api/boom")
    def boom() -> None:
        raise RuntimeError("an unexpected failure")

    r = TestClient(app, raise_server_exceptions=False).get("/api/boom")
    assert r.status_code == 500
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
