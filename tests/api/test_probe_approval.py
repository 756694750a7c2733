"""A probe passes the gate a run passes (backend/runs/gate.py): the plan's owner or an approver asks for it, within
the size bounds; one whose estimate does not fit waits for an approver, under the forced cap; above the cap it is
refused at once. None of these puts a message on the broker."""
from __future__ import annotations

import pytest

from backend.auth.roles import Role
from tests.api.conftest import as_role
from tests.api.test_queue_gate import bearer
from tests.api.test_token_scope import new_token
from tests.tiny import tiny_plan


@pytest.fixture
def broker(tmp_path, monkeypatch):
    """An embedded SQLite broker (no broadcast: nobody can tell whether a worker listens, so a probe is queued);
    answers how many messages it holds."""
    import sqlite3

    from backend.core.settings import get_settings

    path = tmp_path / "broker.db"
    monkeypatch.setenv("ULAB_BROKER_URL", f"sqla+sqlite:///{path}")
    get_settings.cache_clear()

    def messages() -> int:
        if not path.exists():
            return 0
        with sqlite3.connect(path) as db:
            tables = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
            return db.execute("select count(*) from kombu_message").fetchone()[0] if "kombu_message" in tables else 0

    yield messages
    monkeypatch.undo()
    get_settings.cache_clear()


def _store(client, headers, plan: dict) -> int:
    r = client.post("/api/plans", json={"name": "probe gate", **plan}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _probes(client, headers) -> list[dict]:
    return [r for r in client.get("/api/runs", headers=headers).json() if r["kind"] == "probe"]


def huge_plan() -> dict:
    """A 405B-sized Llama in fp32 on one GPU: thousands of GiB per GPU, above the 1,024 GiB forced cap."""
    plan = tiny_plan(sp_size=1)
    plan["model"]["config"].update(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126,
                                   num_attention_heads=128, num_key_value_heads=8, vocab_size=128256)
    return plan


def test_a_probe_above_the_forced_cap_is_refused(client, tokens, broker):
    submitter, _ = new_token(Role.SUBMITTER)
    plan_id = _store(client, bearer(submitter), huge_plan())
    need = client.get(f"/api/plans/{plan_id}", headers=bearer(submitter)).json()["estimate"]["memory"]
    assert need["device_total_gib"] > 1024
    before = len(_probes(client, as_role(client, tokens, "admin")))
    for who in (bearer(submitter), as_role(client, tokens, "approver")):
        r = client.post(f"/api/plans/{plan_id}/probe", headers=who)
        assert r.status_code == 409, r.text
        assert r.json()["detail"][0]["field"] == "estimate.memory"
        assert "ULAB_MAX_FORCED_GIB_PER_GPU" in r.json()["detail"][0]["message"]
    assert len(_probes(client, as_role(client, tokens, "admin"))) == before
    assert broker() == 0


def test_a_probe_over_the_gpu_limit_is_refused(client, tokens, broker):
    submitter, _ = new_token(Role.SUBMITTER)
    plan_id = _store(client, bearer(submitter), tiny_plan(sp_size=1, dp_size=8192, num_nodes=1024))
    r = client.post(f"/api/plans/{plan_id}/probe", headers=bearer(submitter))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0] == {"field": "hardware.gpus_per_node",
                                     "message": "8192 GPUs is above the limit of 4096"}
    assert broker() == 0


def test_another_users_plan_is_not_theirs_to_probe(client, tokens, broker):
    owner, _ = new_token(Role.SUBMITTER)
    other, _ = new_token(Role.SUBMITTER)
    plan_id = _store(client, bearer(owner), tiny_plan())
    r = client.post(f"/api/plans/{plan_id}/probe", headers=bearer(other))
    assert r.status_code == 403, r.text
    assert r.json()["detail"][0]["field"] == "authorization"
    assert broker() == 0
    # an approver may probe any plan; the owner their own
    assert client.post(f"/api/plans/{plan_id}/probe", headers=as_role(client, tokens, "approver")).status_code == 202
    r = client.post(f"/api/plans/{plan_id}/probe", headers=bearer(owner))
    assert (r.status_code, r.json()["state"]) == (202, "queued"), r.text
    assert broker() == 2


def test_a_probe_that_does_not_fit_waits_for_an_approver(client, tokens, broker):
    submitter, submitter_id = new_token(Role.SUBMITTER)
    approver, approver_id = new_token(Role.APPROVER)
    plan_id = _store(client, bearer(submitter), tiny_plan(sp_size=1, seq_len=8 * 1024 * 1024))  # 137 GiB of 80
    r = client.post(f"/api/plans/{plan_id}/probe", headers=bearer(submitter))
    assert r.status_code == 202, r.text
    probe = r.json()
    assert (probe["state"], probe["approved_by"], probe["submitted_by"]) == ("pending_approval", None, submitter_id)
    assert broker() == 0
    r = client.post(f"/api/runs/{probe['id']}/approve", headers=bearer(submitter))
    assert r.status_code == 403, r.text
    r = client.post(f"/api/runs/{probe['id']}/approve", headers=bearer(approver))
    assert r.status_code == 409, r.text
    assert r.json()["detail"][0]["field"] == "estimate.memory"
    assert broker() == 0
    r = client.post(f"/api/runs/{probe['id']}/approve?force=true", headers=bearer(approver))
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["approved_by"], r.json()["forced"]) == ("queued", approver_id, True)
    assert broker() == 1


def test_a_never_approved_probe_cancelled_is_not_retried_into_the_queue(client, tokens, broker):
    submitter, _ = new_token(Role.SUBMITTER)
    plan_id = _store(client, bearer(submitter), tiny_plan(sp_size=1, seq_len=8 * 1024 * 1024))
    probe = client.post(f"/api/plans/{plan_id}/probe", headers=bearer(submitter)).json()
    assert client.post(f"/api/runs/{probe['id']}/cancel", headers=bearer(submitter)).json()["state"] == "cancelled"
    r = client.post(f"/api/runs/{probe['id']}/retry", headers=as_role(client, tokens, "approver"))
    assert r.status_code == 409, r.text
    assert r.json()["detail"][0]["field"] == "state"
    assert broker() == 0
