"""A checkpoint under the models root (ULAB_MODELS_DIR, here the stack's HOME/models) is checked against the plan
before the queue. (One submitted from the form and trained to the end:
tests/e2e/test_dashboard_submit_run_fields.py.)"""
from __future__ import annotations

import pytest

from tests.checkpoints import save_tiny_checkpoint
from tests.tiny import tiny_plan

pytestmark = pytest.mark.slow


def test_a_mismatched_checkpoint_is_refused_before_the_queue(stack, api, corpus):
    save_tiny_checkpoint(stack.home / "models" / "acme" / "wide", weights=False, hidden_size=128)
    r = api.post("/api/plans", json={"name": "mismatch", **tiny_plan()})
    r = api.post("/api/runs", json={"plan_id": r.json()["id"], "run": {"data": {"path": str(corpus)},
                                                                     "model_path": "acme/wide"}})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "run.model_path", r.text
    assert "hidden_size=128" in r.json()["detail"][0]["message"]
