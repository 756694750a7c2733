"""Checkpoint download: GET /api/runs/{id}/checkpoints/{name} streams a tar of one checkpoint directory,
for the roles that may read the run; a missing checkpoint is a 404 naming it; nothing outside the run's checkpoints
directory can be reached through the name."""
from __future__ import annotations

import io
import os
import tarfile

import pytest

from tests.api.conftest import as_role
from tests.api.test_alerts import running_run


@pytest.fixture
def run_with_checkpoint(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_id = running_run(client, admin, run_dir)
    ck = run_dir / "checkpoints" / "stage0" / "checkpoint-3"
    (ck / "global_step3").mkdir(parents=True)
    (ck / "trainer_state.json").write_text('{"global_step": 3}')
    weights = os.urandom(3 * (1 << 20) + 77)  # more than one chunk, not a whole tar block
    (ck / "global_step3" / "mp_rank_00_model_states.pt").write_bytes(weights)
    (ck / "latest").symlink_to("global_step3")
    (tmp_path / "secret.txt").write_text("not for download")
    return run_id, run_dir, weights


def test_a_checkpoint_downloads_as_a_tar_of_its_directory(client, tokens, run_with_checkpoint):
    run_id, _, weights = run_with_checkpoint
    viewer = as_role(client, tokens, "viewer")
    listed = client.get(f"/api/runs/{run_id}/checkpoints", headers=viewer).json()
    assert [c["name"] for c in listed] == ["stage0-checkpoint-3"]
    r = client.get(f"/api/runs/{run_id}/checkpoints/stage0-checkpoint-3", headers=viewer)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/x-tar"
    assert f'filename="run-{run_id}-stage0-checkpoint-3.tar"' in r.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        names = tar.getnames()
        assert names == ["stage0-checkpoint-3", "stage0-checkpoint-3/global_step3",
                         "stage0-checkpoint-3/global_step3/mp_rank_00_model_states.pt",
                         "stage0-checkpoint-3/latest", "stage0-checkpoint-3/trainer_state.json"]
        got = tar.extractfile("stage0-checkpoint-3/global_step3/mp_rank_00_model_states.pt")
        assert got is not None
        assert got.read() == weights
        assert tar.getmember("stage0-checkpoint-3/latest").linkname == "global_step3"
    assert client.get(f"/api/runs/{run_id}/checkpoints/stage0-checkpoint-3").status_code == 401


def test_a_missing_checkpoint_is_a_404_naming_it(client, tokens, run_with_checkpoint):
    run_id = run_with_checkpoint[0]
    viewer = as_role(client, tokens, "viewer")
    r = client.get(f"/api/runs/{run_id}/checkpoints/stage0-checkpoint-9", headers=viewer)
    assert r.status_code == 404
    assert r.json()["detail"] == [{"field": "name", "message": "checkpoint 'stage0-checkpoint-9' does not exist"}]
    assert client.get("/api/runs/999999/checkpoints/stage0-checkpoint-3", headers=viewer).status_code == 404


@pytest.mark.parametrize("name", ["..%2F..%2Fsecret.txt", "stage0-checkpoint-3%2F..%2F..%2F..%2F..%2Fsecret.txt",
                                  "%2E%2E", "stage0%2F..%2F..", "stage0-checkpoint-..", "%2Fetc%2Fpasswd",
                                  "stage1-checkpoint-3"])
def test_no_name_reaches_outside_the_checkpoints(client, tokens, run_with_checkpoint, name):
    run_id = run_with_checkpoint[0]
    r = client.get(f"/api/runs/{run_id}/checkpoints/{name}", headers=as_role(client, tokens, "viewer"))
    assert r.status_code == 404
    assert b"not for download" not in r.content


def test_a_checkpoint_symlinked_out_of_the_run_is_refused(client, tokens, run_with_checkpoint, tmp_path):
    run_id, run_dir, _ = run_with_checkpoint
    outside = tmp_path / "elsewhere" / "checkpoint-5"
    outside.mkdir(parents=True)
    (outside / "trainer_state.json").write_text("{}")
    (run_dir / "checkpoints" / "stage0" / "checkpoint-5").symlink_to(outside)
    r = client.get(f"/api/runs/{run_id}/checkpoints/stage0-checkpoint-5", headers=as_role(client, tokens, "viewer"))
    assert r.status_code == 404
    assert r.json()["detail"][0]["field"] == "name"
