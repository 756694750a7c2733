"""A run whose weights come from a checkpoint under the models root (ULAB_MODELS_DIR, here the stack's HOME/models):
submitted by name, resolved and checked by the API, loaded by the trainer with from_pretrained, trained to the end."""
from __future__ import annotations

import json

import pytest

from tests.checkpoints import save_tiny_checkpoint
from tests.tiny import submit, tiny_plan, wait_for

pytestmark = pytest.mark.slow


def test_a_checkpoint_under_the_models_root_trains_to_succeeded(stack, api, corpus):
    directory = save_tiny_checkpoint(stack.home / "models" / "acme" / "tiny-llama")
    run = submit(api, tiny_plan(sp_size=2), {"steps": 4, "learning_rate": 1e-3, "checkpoint_every": 2,
                                             "data": {"path": str(corpus)}, "model_path": "acme/tiny-llama"},
                 name="from-checkpoint")
    assert run["spec"]["run"]["model_path"] == str(directory.resolve())
    done = wait_for(api, run["id"], {"succeeded"}, timeout_s=300)
    assert done["last_step"] == 4
    # the trainer tokenized with the checkpoint's own tokenizer: model_path reached from_pretrained
    data = json.loads((stack.home / "runs" / f"run-{run['id']}" / "data" / "stage0.json").read_text())
    assert data["tokenizer"] == f"hf:{directory.resolve()}"
    # the checkpoint list reads the run directory: keep_checkpoints (2) of the saves at steps 2 and 4
    listed = api.get(f"/api/runs/{run['id']}/checkpoints").json()
    assert [(c["stage"], c["step"]) for c in listed] == [("stage0", 4), ("stage0", 2)]
    assert all(c["bytes"] > 0 for c in listed)


def test_a_mismatched_checkpoint_is_refused_before_the_queue(stack, api, corpus):
    save_tiny_checkpoint(stack.home / "models" / "acme" / "wide", weights=False, hidden_size=128)
    r = api.post("/api/plans", json={"name": "mismatch", **tiny_plan()})
    r = api.post("/api/runs", json={"plan_id": r.json()["id"], "run": {"data": {"path": str(corpus)},
                                                                     "model_path": "acme/wide"}})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "run.model_path", r.text
    assert "hidden_size=128" in r.json()["detail"][0]["message"]
