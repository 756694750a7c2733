"""The service's side of the seam between the workers and the service (backend/execution/sql_agent.py, behind the agent
API) on a real SQLite database: what a worker does to a run goes through it, and an attempt's by-products (a probe's
result, the calibration point) are stored once, where the attempt ends (backend/execution/outcome.py), for the Celery
worker and the Slurm poller alike."""
from __future__ import annotations

import pytest
from sqlalchemy import select

from backend.calibration.models import CalibrationPoint
from backend.core import db, settings
from backend.execution import outcome
from backend.execution.agent import Claim, RunAgent
from backend.execution.sql_agent import SqlRunAgent
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.states import RunState
from plan.model import Plan
from tests.tiny import tiny_plan


@pytest.fixture(autouse=True)
def database(tmp_path, monkeypatch):
    monkeypatch.setenv("ULAB_DATABASE_URL", f"sqlite:///{tmp_path / 't.db'}")
    monkeypatch.setenv("ULAB_HOME", str(tmp_path / "home"))
    for cached in (settings.get_settings, db.get_engine, db.get_sessionmaker):
        cached.cache_clear()
    db.upgrade_database()
    yield
    for cached in (settings.get_settings, db.get_engine, db.get_sessionmaker):
        cached.cache_clear()


def spec() -> dict:
    data = settings.get_settings().home / "data" / "corpus.txt"  # under an allowed root: the claim checks it
    return {**tiny_plan(), "run": {"steps": 4, "data": {"path": str(data)}}}


def queued_run() -> int:
    with db.session_scope() as s:
        run = Run(name="r", spec=spec(), executor="celery")
        s.add(run)
        s.flush()
        transitions.approve(run, by=None, forced=False)
        return run.id


def calibration_points(run_id: int) -> list[str]:
    with db.session_scope() as s:
        return list(s.scalars(select(CalibrationPoint.source_ref).where(CalibrationPoint.run_id == run_id)))


def running(agent: RunAgent) -> Claim:
    claim = agent.claim(queued_run(), "host:1")
    assert claim is not None
    assert agent.start(claim.id, claim.attempt, "/tmp/run")
    return claim


def test_a_claim_is_plain_data_of_the_live_attempt():
    agent = SqlRunAgent()
    run_id = queued_run()
    claim = agent.claim(run_id, "host:1")
    assert claim is not None
    assert claim.token.startswith("ulab_attempt_")  # the attempt's: its later calls and metrics present it
    assert claim == Claim(id=run_id, attempt=1, spec=spec(), worker="host:1", token=claim.token)
    assert agent.claim(run_id, "host:2") is None  # a second delivery gets nothing
    assert agent.heartbeat(run_id, 1, last_step=0) is False


def test_a_run_that_never_stepped_leaves_no_calibration_point():
    # the stricter of the two copies that drifted (the Slurm poller's): a run with no step measured nothing
    agent = SqlRunAgent()
    claim = running(agent)
    assert agent.finish(claim.id, claim.attempt, RunState.FAILED, "exit code 1", last_step=0)
    assert calibration_points(claim.id) == []
    outcome.record_calibration(claim.id)  # also when asked directly
    assert calibration_points(claim.id) == []


def test_a_run_that_stepped_gets_its_calibration_point_once_it_ended():
    agent = SqlRunAgent()
    claim = running(agent)
    assert agent.heartbeat(claim.id, claim.attempt, last_step=3) is False
    assert calibration_points(claim.id) == []
    assert agent.finish(claim.id, claim.attempt, RunState.OOM, "out of memory", last_step=3)
    assert calibration_points(claim.id) == [f"run {claim.id} attempt 1"]
    with db.session_scope() as s:
        assert s.get_one(Run, claim.id).state == RunState.OOM.value


def test_an_attempt_that_is_no_longer_live_records_nothing():
    agent = SqlRunAgent()
    claim = running(agent)
    with db.session_scope() as s:
        run = s.get_one(Run, claim.id)
        transitions.mark_lost(s, run, "no heartbeat")
    assert agent.finish(claim.id, claim.attempt, RunState.FAILED, "exit code 1", last_step=3) is False
    assert calibration_points(claim.id) == []


def test_a_cancelled_run_leaves_no_calibration_point():
    agent = SqlRunAgent()
    claim = running(agent)
    assert agent.finish(claim.id, claim.attempt, RunState.CANCELLED, "cancelled by request", last_step=3)
    assert calibration_points(claim.id) == []


def test_the_forwarder_reads_what_was_stored_through_the_seam():
    agent = SqlRunAgent()
    claim = running(agent)
    stored = agent.stored(claim.id, after=0)
    assert (stored.state, stored.ended, stored.rows, stored.alerts) == ("running", False, [], {})
    assert stored.plan == spec()
    with pytest.raises(LookupError, match="run_id"):
        agent.stored(claim.id + 1, after=0)


def test_a_run_and_a_claim_read_the_validated_plan():
    agent = SqlRunAgent()
    claim = running(agent)
    assert isinstance(claim.plan, Plan)
    assert claim.plan is claim.plan  # validated once
    assert (claim.plan.hardware.gpus_per_node, claim.plan.run and claim.plan.run.steps) == (2, 4)
    with db.session_scope() as s:
        run = s.get_one(Run, claim.id)
        first = run.plan
        assert first is run.plan  # kept while the spec is the same
        assert first.training.seq_len == 512
        run.spec = {**run.spec, "run": {**run.spec["run"], "steps": 9}}
        assert run.plan is not first
        assert run.plan.run is not None
        assert run.plan.run.steps == 9
