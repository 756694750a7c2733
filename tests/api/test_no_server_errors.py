"""Input that crashed a parser or a library is a 4xx naming the field: deep nesting and 5,000-digit integers in a
JSON body or a pasted file, and tokenizer or checkpoint names that are neither a directory nor a Hugging Face id."""
from __future__ import annotations

import pytest

from tests.api.conftest import as_role
from tests.api.crafted import IMPORT_TEXTS, ODD_SOURCES, deep_body, long_int_body
from tests.api.test_input_limits import raw
from tests.api.test_queue_gate import submitted_run

LONG_INT_ROUTES = {"/api/estimate": "training.micro_batch_size", "/api/plans": "training.micro_batch_size",
                   "/api/estimate/max-seq": "training.micro_batch_size", "/api/plans/import": "gpus_per_node",
                   "/api/runs": "plan_id", "/api/plans/1/probe": "steps", "/api/runs/1/metrics": "points.0.step"}


@pytest.mark.parametrize(("field", "text"), IMPORT_TEXTS, ids=[f"{f}-{t[:12]}" for f, t in IMPORT_TEXTS])
def test_a_pasted_file_past_the_limits_is_a_422_naming_it(client, tokens, field, text):
    r = client.post("/api/plans/import", json={field: text}, headers=as_role(client, tokens, "viewer"))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == field


@pytest.mark.parametrize("path", list(LONG_INT_ROUTES))
def test_a_5000_digit_integer_is_a_422_naming_its_field(client, tokens, path):
    r = raw(client, path, long_int_body(path), as_role(client, tokens, "admin"))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == LONG_INT_ROUTES[path]
    assert "5,000 digits" in r.json()["detail"][0]["message"]


def test_a_metric_batch_nested_past_the_parser_is_a_422_naming_the_body(client, tokens, tmp_path):
    r = raw(client, "/api/runs/1/metrics", deep_body(), as_role(client, tokens, "admin"))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "body"
    assert "nested deeper than" in r.json()["detail"][0]["message"]


def test_a_route_or_method_that_does_not_exist_names_it(client, tokens):
    r = client.get("/api/nothing-here", headers=as_role(client, tokens, "viewer"))
    assert (r.status_code, r.json()["detail"][0]["field"]) == (404, "path")
    r = client.delete("/api/plans", headers=as_role(client, tokens, "admin"))
    assert (r.status_code, r.json()["detail"][0]["field"]) == (405, "method")


@pytest.mark.parametrize("name", ODD_SOURCES)
def test_an_odd_tokenizer_is_a_422_naming_it_at_approval(client, tokens, tmp_path, name):
    admin = as_role(client, tokens, "admin")
    run_id = submitted_run(client, admin, tmp_path, run={"tokenizer": name})
    if run_id is None:
        return  # refused at submit, naming the field (submitted_run checked it)
    r = client.post(f"/api/runs/{run_id}/approve", headers=admin)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "run.tokenizer"


@pytest.mark.parametrize("name", ODD_SOURCES)
def test_an_odd_checkpoint_is_a_422_naming_it(client, tokens, tmp_path, name):
    admin = as_role(client, tokens, "admin")
    run_id = submitted_run(client, admin, tmp_path, run={"model_path": name})
    if run_id is None:
        return
    r = client.post(f"/api/runs/{run_id}/approve", headers=admin)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "run.model_path"
