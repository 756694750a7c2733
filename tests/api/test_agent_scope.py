"""Workers speak HTTP only, with what a worker holds: its own token (role worker, scoped to its queues) and the token of
each attempt it claimed. The worker's real client (backend/execution/agent.py's HttpRunAgent) calls the app in process.
Each way a worker with the database URL once abused it is tried here with only those tokens, and refused: minting or
raising a token, queueing another user's run as approved, rewriting another run's metrics and outcome, reading every
user's runs."""
from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from backend.auth.roles import Role
from backend.core.db import session_scope
from backend.core.settings import Settings
from backend.execution.agent import AgentRefused, HttpRunAgent
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.states import RunState
from tests.api.conftest import WORKER_QUEUE, as_role
from tests.api.test_queue_gate import submitted_run
from tests.api.test_token_scope import queued_run


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def worker_agent(client: TestClient, token: str) -> HttpRunAgent:
    """A worker's agent holding only `token` (no database URL is used: every call goes over HTTP to the app)."""
    return HttpRunAgent(Settings(worker_token=token, attempt_token=""), client=client)


def points(step: int, value: float) -> dict:
    return {"points": [{"rank": 0, "step": step, "name": "loss", "value": value, "wall_time": 0.0}]}


def state_of(run_id: int) -> str:
    with session_scope() as s:
        return s.get_one(Run, run_id).state


def test_a_worker_runs_an_attempt_over_http_with_the_claims_token(client, tokens, tmp_path):
    agent = worker_agent(client, tokens["worker"])
    run_id = queued_run(client, tokens, tmp_path)
    claim = agent.claim(run_id, "host:1")
    assert claim is not None
    assert (claim.id, claim.attempt, claim.worker) == (run_id, 1, "host:1")
    assert claim.token.startswith("ulab_attempt_")
    assert agent.claim(run_id, "host:2") is None  # a second delivery gets nothing
    assert agent.start(run_id, 1, str(tmp_path)) is True
    assert agent.heartbeat(run_id, 1, last_step=0) is False
    assert client.post(f"/api/runs/{run_id}/metrics", json=points(1, 2.5), headers=bearer(claim.token)).json() == \
        {"accepted": 1}
    r = client.post(f"/api/runs/{run_id}/metrics", json=points(1, 2.5), headers=bearer(tokens["worker"]))
    assert r.status_code == 403, r.text  # the worker's own token writes no metrics: the attempt's does
    stored = agent.stored(run_id, after=0)
    assert (stored.state, stored.ended) == ("running", False)
    assert agent.finish(run_id, 1, RunState.FAILED, "exit code 1", last_step=0) is True  # no calibration point
    assert state_of(run_id) == "failed"


def test_a_worker_token_claims_only_runs_of_its_queues(client, tokens, tmp_path):
    with session_scope() as s:
        from backend.auth.service import create_token

        _, other_queue = create_token(s, "a100 worker", Role.WORKER, ["gpu-a100-80gb"])
    run_id = queued_run(client, tokens, tmp_path)
    with pytest.raises(AgentRefused, match=f"403.*{WORKER_QUEUE}"):
        worker_agent(client, other_queue).claim(run_id, "host:1")
    with pytest.raises(AgentRefused, match="403.*does not serve gpu-h100-80gb"):
        worker_agent(client, other_queue).worker_started("host", [WORKER_QUEUE], {})
    assert state_of(run_id) == "queued"


def test_a_worker_token_reads_no_users_runs_logs_checkpoints_or_tokens(client, tokens, tmp_path):
    run_id = queued_run(client, tokens, tmp_path)
    for token in (tokens["worker"], worker_agent(client, tokens["worker"]).claim(run_id, "host:1").token):
        for path in ("/api/runs", f"/api/runs/{run_id}", f"/api/runs/{run_id}/log", f"/api/runs/{run_id}/checkpoints",
                     f"/api/runs/{run_id}/metrics?name=loss", f"/api/runs/{run_id}/metrics.csv",
                     f"/api/runs/{run_id}/events", "/api/tokens", "/api/plans"):
            r = client.get(path, headers=bearer(token))
            assert r.status_code in (401, 403), (path, r.status_code, r.text)
            assert r.json()["detail"][0]["field"] == "authorization", r.text


def test_a_worker_can_neither_mint_a_token_nor_raise_its_own(client, tokens):
    """The attack "inserting a token row" and "raising the worker's own token to admin": without the database URL,
    the API is the only way, and it refuses the worker's token and an attempt's."""
    for role in ("admin", "worker"):
        body = {"name": "mine", "role": role, "queues": [WORKER_QUEUE] if role == "worker" else []}
        r = client.post("/api/tokens", json=body, headers=bearer(tokens["worker"]))
        assert r.status_code == 403, r.text
    browser = TestClient(client.app)  # its own cookie jar
    assert browser.post("/api/session", json={"token": tokens["worker"]}).status_code == 200
    assert browser.get("/api/runs").status_code == 403  # a session of it is no wider


def test_a_worker_cannot_queue_another_users_run_as_approved(client, tokens, tmp_path):
    """The attack "one UPDATE queued another user's never-approved run with approved_by set": the worker may approve
    nothing, and its claim takes only a queued run."""
    run_id = submitted_run(client, as_role(client, tokens, "submitter"), tmp_path)  # never approved
    agent = worker_agent(client, tokens["worker"])
    assert client.post(f"/api/runs/{run_id}/approve", headers=bearer(tokens["worker"])).status_code == 403
    assert agent.claim(run_id, "host:1") is None
    other = queued_run(client, tokens, tmp_path)
    held = agent.claim(other, "host:1")
    assert held is not None
    assert client.post(f"/api/runs/{run_id}/approve", headers=bearer(held.token)).status_code == 401
    with pytest.raises(AgentRefused, match="403"):  # its attempt's token starts no other run
        HttpRunAgent(Settings(attempt_token=held.token), client=client).start(run_id, 1, str(tmp_path))
    with session_scope() as s:
        run = s.get_one(Run, run_id)
        assert (run.state, run.approved_by, run.started_at) == ("pending_approval", None, None)


def test_a_worker_cannot_rewrite_another_runs_metrics_or_outcome(client, tokens, tmp_path):
    """The attack "another user's finished run had its loss rows divided by 100 and its state set to failed with a
    made-up out-of-memory reason": with its own tokens a worker reaches neither the rows nor the state."""
    agent = worker_agent(client, tokens["worker"])
    theirs = queued_run(client, tokens, tmp_path)
    their_claim = agent.claim(theirs, "their-host:1")
    assert their_claim is not None
    client.post(f"/api/runs/{theirs}/metrics", json=points(1, 2.0), headers=bearer(their_claim.token))
    mine = agent.claim(queued_run(client, tokens, tmp_path), "my-host:1")
    assert mine is not None
    mine_agent = HttpRunAgent(Settings(attempt_token=mine.token), client=client)
    for token in (tokens["worker"], mine.token):
        r = client.post(f"/api/runs/{theirs}/metrics", json=points(1, 0.02), headers=bearer(token))
        assert r.status_code == 403, r.text
    with pytest.raises(AgentRefused, match="403"):
        mine_agent.finish(theirs, 1, RunState.OOM, "out of memory")
    with pytest.raises(AgentRefused, match="403"):
        mine_agent.stored(theirs, after=0)
    with pytest.raises(AgentRefused, match="403"):
        mine_agent.trainer_stopped(theirs, 1, "diverged", 1, "made up")
    viewer = as_role(client, tokens, "viewer")
    q = client.get(f"/api/runs/{theirs}/metrics", params={"name": "loss"}, headers=viewer).json()
    assert q["series"][0]["last"] == [2.0]
    assert client.get(f"/api/runs/{theirs}", headers=viewer).json()["state"] == "starting"


def test_a_node_token_acts_for_its_node_only(client, tokens, tmp_path):
    agent = worker_agent(client, tokens["worker"])
    run_id = queued_run(client, tokens, tmp_path)
    node0 = agent.claim(run_id, "host:0")
    node1 = worker_agent(client, tokens["worker"]).claim_node(run_id, 1, "host:1")
    assert node0 is not None
    assert node1 is not None
    assert node1.token != node0.token
    node_agent = HttpRunAgent(Settings(attempt_token=node1.token), client=client)
    with pytest.raises(AgentRefused, match="403.*node 1"):
        node_agent.finish(run_id, 1, RunState.SUCCEEDED, None)
    with pytest.raises(AgentRefused, match="403"):
        node_agent.node_heartbeat(run_id, 1, 2)
    assert node_agent.node_heartbeat(run_id, 1, 1) is False
    assert node_agent.endpoint(run_id, 1).address is None


def test_an_attempt_token_expires_with_its_attempt(client, tokens, tmp_path):
    agent = worker_agent(client, tokens["worker"])
    run_id = queued_run(client, tokens, tmp_path)
    claim = agent.claim(run_id, "host:1")
    assert claim is not None
    assert agent.start(run_id, 1, str(tmp_path))
    with session_scope() as s:  # the reaper: lost, and the next attempt queued
        run = s.get_one(Run, run_id)
        transitions.mark_lost(s, run, "no heartbeat")
        transitions.queue_retry(run)
    assert agent.heartbeat(run_id, 1, last_step=3) is True  # the old attempt's worker is told to stop
    assert agent.finish(run_id, 1, RunState.FAILED, "late") is False
    r = client.post(f"/api/runs/{run_id}/metrics", json=points(3, 1.0), headers=bearer(claim.token))
    assert r.status_code == 401, r.text
    second = agent.claim(run_id, "host:2")
    assert second is not None
    assert second.attempt == 2
    assert agent.finish(run_id, 2, RunState.FAILED, "exit code 1")
    # the worker drains its last lines for a minute after the end; then the token is dead
    r = client.post(f"/api/runs/{run_id}/metrics", json=points(1, 1.0), headers=bearer(second.token))
    assert r.status_code == 200, r.text
    with session_scope() as s:
        run = s.get_one(Run, run_id)
        run.finished_at = transitions.as_utc(run.finished_at) - timedelta(seconds=61)
    r = client.post(f"/api/runs/{run_id}/metrics", json=points(2, 1.0), headers=bearer(second.token))
    assert r.status_code == 401, r.text
    assert agent.heartbeat(run_id, 2, last_step=3) is True


def test_a_worker_token_names_its_queues(client, tokens):
    admin = as_role(client, tokens, "admin")
    r = client.post("/api/tokens", json={"name": "w", "role": "worker"}, headers=admin)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "queues", r.text
    r = client.post("/api/tokens", json={"name": "v", "role": "viewer", "queues": [WORKER_QUEUE]}, headers=admin)
    assert r.status_code == 422, r.text
    r = client.post("/api/tokens", json={"name": "w", "role": "worker", "queues": ["GPU H100; drop"]}, headers=admin)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"].startswith("queues"), r.text
    r = client.post("/api/tokens", json={"name": "w", "role": "worker", "queues": [WORKER_QUEUE]}, headers=admin)
    assert r.status_code == 201, r.text
    assert r.json()["queues"] == [WORKER_QUEUE]


def test_a_worker_reads_its_token_and_never_mints_one(tmp_path):
    from backend.execution.agent import worker_token

    home = tmp_path / "home"
    with pytest.raises(AgentRefused, match="no worker token: set ULAB_WORKER_TOKEN"):
        worker_token(Settings(home=home, worker_token=""))
    assert not home.exists()  # nothing written, no database touched
    home.mkdir()
    (home / "worker-token").write_text("ulab_kept\n")
    assert worker_token(Settings(home=home, worker_token="")) == "ulab_kept"
    assert worker_token(Settings(home=home, worker_token="ulab_given")) == "ulab_given"


def test_a_silence_counts_only_while_the_api_listens(client, tokens, tmp_path):
    """Workers beat through the API: an API that was down does not count its own downtime against them."""
    from backend.execution import reaper as lifecycle

    agent = worker_agent(client, tokens["worker"])
    run_id = queued_run(client, tokens, tmp_path)
    assert agent.claim(run_id, "host:1") is not None
    assert agent.start(run_id, 1, str(tmp_path))
    with session_scope() as s:
        s.get_one(Run, run_id).heartbeat_at = transitions.now() - timedelta(minutes=5)
    just_started = transitions.now() - timedelta(seconds=10)
    assert lifecycle.reap_lost(60, listening_since=just_started) == []
    assert state_of(run_id) == "running"
    assert run_id in lifecycle.reap_lost(60, listening_since=transitions.now() - timedelta(seconds=61))
    assert state_of(run_id) == "lost"
