"""Submit and approve check where a run's weights come from (backend/inputs/model_source.py): a directory under the
models root or the hub cache, holding the architecture the plan was estimated for; errors name run.model_path."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.api.conftest import as_role
from tests.checkpoints import save_tiny_checkpoint, save_tiny_tokenizer
from tests.tiny import tiny_plan

PRESET = {"model": {"preset": "Qwen/Qwen3-4B"}, "hardware": {"gpu": "H100-80GB"}, "training": {"seq_len": 8192}}


@pytest.fixture
def admin(client, tokens):
    return as_role(client, tokens, "admin")


@pytest.fixture
def models_dir(app_env) -> Path:
    return Path(app_env["ULAB_HOME"]) / "models"  # the default models root: HOME/models


@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "d.txt"
    path.write_text("the quick brown fox. " * 200)
    return path


@pytest.fixture(autouse=True)
def empty_hub_cache(tmp_path, monkeypatch) -> Path:
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def submit(client, admin, plan: dict, run: dict):
    plan_id = client.post("/api/plans", json=plan, headers=admin).json()["id"]
    return client.post("/api/runs", json={"plan_id": plan_id, "run": run}, headers=admin)


def error(r) -> tuple[str, str]:
    assert r.status_code == 422, r.text
    return r.json()["detail"][0]["field"], r.json()["detail"][0]["message"]


def test_a_name_under_the_models_root_resolves_to_its_directory(client, admin, models_dir, data):
    save_tiny_checkpoint(models_dir / "acme" / "tiny-llama", weights=False)
    r = submit(client, admin, tiny_plan(), {"data": {"path": str(data)}, "model_path": "acme/tiny-llama"})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["run"]["model_path"] == str((models_dir / "acme" / "tiny-llama").resolve())


def test_planning_and_exports_of_a_preset_run_never_need_its_weights(client, admin, data):
    """A planning host holds no weights; the estimate, --effective, the exports and the zip answer."""
    plan = PRESET | {"run": {"data": {"path": str(data)}}}
    for path in ("/api/estimate", "/api/plans/effective", "/api/estimate/export", "/api/estimate/export.zip"):
        r = client.post(path, json=plan, headers=admin)
        assert r.status_code == 200, (path, r.text)
    assert json.loads(client.post("/api/estimate/export", json=plan, headers=admin).json()["plan_json"])["run"]


def test_a_checkpoint_without_a_tokenizer_is_refused_at_approval_naming_the_field(client, admin, models_dir, data):
    """Without tokenizer files Transformers builds an empty tokenizer and the run fails blaming its data;
    approval names run.model_path, or run.tokenizer when the plan names one."""
    bare = save_tiny_checkpoint(models_dir / "acme" / "no-tokenizer", weights=False)
    r = submit(client, admin, tiny_plan(), {"data": {"path": str(data)}, "model_path": "acme/no-tokenizer"})
    assert r.status_code == 201, r.text
    field, message = error(client.post(f"/api/runs/{r.json()['id']}/approve", headers=admin))
    assert field == "run.model_path"
    assert "holds no tokenizer files" in message
    assert "run.tokenizer" in message
    r = submit(client, admin, tiny_plan(), {"data": {"path": str(data)}, "model_path": "acme/no-tokenizer",
                                            "tokenizer": str(bare)})
    field, message = error(client.post(f"/api/runs/{r.json()['id']}/approve", headers=admin))
    assert field == "run.tokenizer"
    assert "holds no tokenizer" in message
    save_tiny_tokenizer(models_dir / "acme" / "a-tokenizer")
    r = submit(client, admin, tiny_plan(), {"data": {"path": str(data)}, "model_path": "acme/no-tokenizer",
                                            "tokenizer": "acme/a-tokenizer"})  # a name under the models root
    approved = client.post(f"/api/runs/{r.json()['id']}/approve", headers=admin)
    assert approved.status_code == 200, approved.text
    assert approved.json()["spec"]["run"]["tokenizer"] == str((models_dir / "acme" / "a-tokenizer").resolve())


def test_a_preset_without_a_checkpoint_is_refused_at_submit(client, admin, data):
    field, message = error(submit(client, admin, PRESET, {"data": {"path": str(data)}}))
    assert field == "run.model_path"
    assert "model.preset Qwen/Qwen3-4B has no checkpoint" in message
    assert "models/Qwen/Qwen3-4B" in message


def test_a_preset_resolves_to_its_directory_and_the_architecture_must_match(client, admin, models_dir, data):
    save_tiny_checkpoint(models_dir / "Qwen" / "Qwen3-4B", weights=False)  # a tiny llama where Qwen3-4B belongs
    field, message = error(submit(client, admin, PRESET, {"data": {"path": str(data)}}))
    assert field == "run.model_path"
    assert "model_type='llama'" in message
    assert "model_type='qwen3'" in message


def test_each_architecture_field_is_named(client, admin, models_dir, data):
    for key, value in (("hidden_size", 128), ("num_hidden_layers", 3), ("num_attention_heads", 8),
                       ("vocab_size", 1024)):
        directory = save_tiny_checkpoint(models_dir / f"other-{key}", weights=False, **{key: value})
        field, message = error(submit(client, admin, tiny_plan(), {"data": {"path": str(data)},
                                                                   "model_path": str(directory)}))
        assert field == "run.model_path", message
        assert f"{key}={value!r}" in message, message


def test_a_directory_without_config_json_is_refused(client, admin, models_dir, data):
    (models_dir / "empty").mkdir(parents=True, exist_ok=True)
    field, message = error(submit(client, admin, tiny_plan(), {"data": {"path": str(data)}, "model_path": "empty"}))
    assert field == "run.model_path"
    assert "has no config.json" in message


def test_a_hub_id_is_kept_when_its_config_is_in_the_hub_cache(client, admin, data, empty_hub_cache, models_dir):
    # the layout huggingface_hub writes: models--org--name/refs/main and snapshots/<commit>/config.json
    repo = empty_hub_cache / "models--acme--cached-tiny"
    snapshot = save_tiny_checkpoint(repo / "snapshots" / "abc123", weights=False)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    r = submit(client, admin, tiny_plan(), {"data": {"path": str(data)}, "model_path": "acme/cached-tiny"})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["run"]["model_path"] == "acme/cached-tiny"
    cfg = json.loads((snapshot / "config.json").read_text())
    cfg["hidden_size"] = 96
    (snapshot / "config.json").write_text(json.dumps(cfg))
    field, message = error(submit(client, admin, tiny_plan(), {"data": {"path": str(data)},
                                                               "model_path": "acme/cached-tiny"}))
    assert field == "run.model_path"
    assert "hidden_size=96" in message


def test_approval_refuses_a_hub_id_that_is_not_downloaded_and_a_missing_data_file(client, admin, tmp_path, data):
    r = submit(client, admin, tiny_plan(), {"data": {"path": str(data)}, "model_path": "acme/not-downloaded"})
    assert r.status_code == 201, r.text  # it may be downloaded before approval
    field, message = error(client.post(f"/api/runs/{r.json()['id']}/approve", headers=admin))
    assert field == "run.model_path"
    assert "acme/not-downloaded is not downloaded" in message
    assert client.get(f"/api/runs/{r.json()['id']}", headers=admin).json()["state"] == "pending_approval"

    gone = tmp_path / "gone.txt"
    gone.write_text("x")
    r = submit(client, admin, tiny_plan(), {"data": {"path": str(gone)}})
    gone.unlink()
    field, _ = error(client.post(f"/api/runs/{r.json()['id']}/approve", headers=admin))
    assert field == "run.data.path"


# huggingface_hub rejects these as repo ids (HFValidationError), and no system takes a path part over 255 bytes:
# each was a 500, and is a 422 naming the field
NOT_HUB_IDS = ["org/na--me", "a/..", "org/x.", "org/-x", "org/a..b", "a/."]
LONG_PART = "/tmp/" + "x" * 256


@pytest.mark.parametrize("name", NOT_HUB_IDS + [LONG_PART, "org/" + "y" * 256, "~nosuchuser-ulab/x"])
def test_a_name_neither_a_path_nor_a_hub_id_is_a_422_naming_the_field(client, admin, data, name):
    field, message = error(submit(client, admin, tiny_plan(), {"data": {"path": str(data)}, "model_path": name}))
    assert field == "run.model_path", message


def test_an_over_long_data_path_part_is_a_422_naming_the_field(client, admin):
    field, message = error(submit(client, admin, tiny_plan(), {"data": {"path": LONG_PART}}))
    assert field == "run.data.path", message
    assert "255 bytes" in message, message
