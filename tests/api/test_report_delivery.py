"""An attempt's start and end reach the service through a short API outage: the worker tries its report again
(worker/supervise.py `deliver`) and beats meanwhile, so a run whose trainer finished while the API restarted is
recorded as it ended, once, and is never reaped as lost for it. A refusal is not retried, and the report gives up
after ULAB_REPORT_RETRY_S. The calls go over the agent API of the real app (SQLite); the outage is a transport
that refuses every connection until a given time, as a stopped API's port does."""
from __future__ import annotations

import time

import httpx
import pytest

from backend.core.db import session_scope
from backend.core.settings import Settings
from backend.execution.agent import AgentRefused, HttpRunAgent, RunState
from backend.runs.models import Run
from tests.api.test_token_scope import queued_run
from worker.supervise import deliver


class AppAsHttpx:
    """The app's test client (httpx2 underneath) answering as an httpx.Client does: the worker's code reads httpx."""

    def __init__(self, inner):
        self.inner = inner

    def post(self, url: str, **kw) -> httpx.Response:
        r = self.inner.post(url, **kw)
        return httpx.Response(r.status_code, content=r.content, request=httpx.Request("POST", url))


class Outage:
    """The app's client, refusing connections (httpx.ConnectError, as from a closed port) until `up_at`."""

    def __init__(self, inner, up_at: float):
        self.inner, self.up_at = inner, up_at
        self.refused: list[str] = []
        self.served: list[tuple[float, str]] = []

    def request(self, method: str, url: str, **kw):
        if time.monotonic() < self.up_at:
            self.refused.append(url)
            raise httpx.ConnectError("[Errno 111] Connection refused")
        self.served.append((time.monotonic(), url))
        return self.inner.request(method, url, **kw)


@pytest.fixture
def running(client, tokens, tmp_path):
    """A run claimed and started by a worker over the agent API: (run id, attempt, the attempt's token)."""
    run_id = queued_run(client, tokens, tmp_path)
    claim = HttpRunAgent(Settings(worker_token=tokens["worker"]), client=client).claim(run_id, "w:1")
    assert claim is not None
    agent = HttpRunAgent(Settings(attempt_token=claim.token), client=client)
    assert agent.start(run_id, claim.attempt, str(tmp_path / "run"))
    return run_id, claim.attempt, claim.token


def outage_agent(client, token: str, down_s: float) -> tuple[HttpRunAgent, Outage]:
    outage = Outage(client, time.monotonic() + down_s)
    return HttpRunAgent(Settings(attempt_token=token), client=outage), outage  # type: ignore[arg-type]


REASON = "exit code 1: the trainer's own reason"


def ended(run_id: int) -> tuple[str, str | None]:
    with session_scope() as s:
        run = s.get(Run, run_id)
        assert run is not None
        return run.state, run.exit_reason


def test_the_outcome_is_delivered_once_the_api_is_back_and_the_run_beats_meanwhile(client, running):
    run_id, attempt, token = running
    agent, outage = outage_agent(client, token, down_s=2.5)
    settings = Settings(heartbeat_s=0.2, report_retry_s=60.0)
    t0 = time.monotonic()
    ok = deliver(lambda: agent.finish(run_id, attempt, RunState.FAILED, REASON, last_step=4), settings,
                 lambda: agent.heartbeat(run_id, attempt, 4), f"run {run_id}: the outcome")
    assert ok is True
    assert ended(run_id) == ("failed", REASON)  # as the worker reported it, not `lost`
    finish = f"/api/agent/v1/runs/{run_id}/attempts/{attempt}/finish"
    beat = f"/api/agent/v1/runs/{run_id}/attempts/{attempt}/heartbeat"
    assert outage.refused.count(finish) >= 2  # tried while the API was away, not given up on
    assert [p for _, p in outage.served].count(finish) == 1  # one outcome record
    assert outage.refused.count(beat) >= 5  # the heartbeat went on while the report waited (every 0.2 s)
    assert time.monotonic() - t0 < 10


def test_without_the_fix_the_report_dies_with_the_api(client, running):
    """What a worker did before `deliver`: one try, and the run's outcome was lost with the exception."""
    run_id, attempt, token = running
    agent, _ = outage_agent(client, token, down_s=2.0)
    with pytest.raises(httpx.ConnectError):
        agent.finish(run_id, attempt, RunState.FAILED, REASON, last_step=4)
    assert ended(run_id) == ("running", None)


def test_a_refusal_is_not_retried():
    calls: list[int] = []

    def refused() -> bool:
        calls.append(1)
        raise AgentRefused("POST /api/agent/v1/runs/1/attempts/1/finish: 403 not this attempt's token", 403)

    with pytest.raises(AgentRefused):
        deliver(refused, Settings(report_retry_s=60.0))
    assert calls == [1]


def test_a_5xx_is_retried_like_an_unreachable_api():
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise AgentRefused("POST ...: 503 Service Unavailable", 503)
        return "done"

    assert deliver(flaky, Settings(report_retry_s=60.0)) == "done"
    assert len(calls) == 3


def test_the_report_gives_up_after_report_retry_s(client, running):
    run_id, attempt, token = running
    agent, outage = outage_agent(client, token, down_s=3600)
    t0 = time.monotonic()
    with pytest.raises(httpx.ConnectError):
        deliver(lambda: agent.finish(run_id, attempt, RunState.FAILED, REASON), Settings(report_retry_s=1.5))
    assert 1.5 <= time.monotonic() - t0 < 5
    assert len(outage.refused) >= 2
    assert ended(run_id) == ("running", None)


def test_the_start_is_delivered_through_an_outage(client, tokens, tmp_path):
    """The trainer is launched before the worker reports the start: an API away at that moment must not cost the
    attempt (the worker used to stop the trainer and leave the run `starting` until it was reaped)."""
    run_id = queued_run(client, tokens, tmp_path)
    claim = HttpRunAgent(Settings(worker_token=tokens["worker"]), client=client).claim(run_id, "w:1")
    assert claim is not None
    agent, outage = outage_agent(client, claim.token, down_s=1.5)
    assert deliver(lambda: agent.start(run_id, claim.attempt, str(tmp_path / "run")),
                   Settings(heartbeat_s=0.2, report_retry_s=60.0)) is True
    assert ended(run_id) == ("running", None)
    assert outage.refused.count(f"/api/agent/v1/runs/{run_id}/attempts/{claim.attempt}/start") >= 1


def test_a_node_waits_for_node_0s_endpoint_through_an_outage(client, tokens, tmp_path, monkeypatch):
    """Node k > 0 polls node 0's rendezvous endpoint: an API restarting meanwhile delays the answer instead of
    ending the node's task (its ranks would never start, and node 0's would wait for them)."""
    from worker import gang

    run_id = queued_run(client, tokens, tmp_path)
    worker = HttpRunAgent(Settings(worker_token=tokens["worker"]), client=client)
    node0 = worker.claim(run_id, "w:0")
    assert node0 is not None
    HttpRunAgent(Settings(attempt_token=node0.token), client=client).register_node(
        run_id, node0.attempt, "w:0", "10.0.0.1:29500")
    node1 = worker.claim_node(run_id, 1, "w:1")
    assert node1 is not None
    agent, outage = outage_agent(client, node1.token, down_s=1.2)
    monkeypatch.setattr(gang, "get_agent", lambda: agent)
    assert gang.wait_for_endpoint(run_id, node1.attempt) == "10.0.0.1:29500"
    assert outage.refused  # it asked while the API was away, and again after


def test_the_drain_stops_at_a_refusal_but_goes_on_through_an_outage(client, tmp_path):
    """After the trainer exits the worker drains its metrics for as long as a report waits (ULAB_REPORT_RETRY_S):
    through an API that cannot be reached, but not past a refusal (an attempt whose token no longer writes, as after a
    cancel), which no later try would change: the worker would sit on it for the whole wait."""
    import json

    from worker.shipper import MetricShipper
    from worker.trainer.attempt import metrics_file

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    metrics_file(run_dir, 1).write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    refused = MetricShipper(run_dir, "http://testserver", 999_999, "ulab_not_a_token")
    refused.client = AppAsHttpx(client)  # the real app, which knows no such token: 401
    t0 = time.monotonic()
    assert refused.drain(deadline_s=30) is False
    assert refused.refused == 401
    assert time.monotonic() - t0 < 5
    away = MetricShipper(run_dir, "http://127.0.0.1:9", 1, "t")  # nothing listens there: connection refused
    t0 = time.monotonic()
    assert away.drain(deadline_s=1.5) is False
    assert away.refused is None
    assert time.monotonic() - t0 >= 1.5
