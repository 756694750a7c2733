"""A node worker of a gang whose run or node row is gone (removed by hand, or a database restored from an older
backup) stops cleanly instead of dying on a None: heartbeat says stop, the endpoint wait ends, the exit is logged."""
import pytest

from backend.core import db, settings
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.nodes import RunNode
from worker import gang


@pytest.fixture(autouse=True)
def database(tmp_path, monkeypatch):
    monkeypatch.setenv("ULAB_DATABASE_URL", f"sqlite:///{tmp_path / 't.db'}")
    for cached in (settings.get_settings, db.get_engine, db.get_sessionmaker):
        cached.cache_clear()
    db.upgrade_database()
    yield
    for cached in (settings.get_settings, db.get_engine, db.get_sessionmaker):
        cached.cache_clear()


def queued_run() -> int:
    with db.session_scope() as s:
        run = Run(name="r", spec={"run": {}}, executor="celery")
        s.add(run)
        s.flush()
        transitions.approve(run, by=None, forced=False)
        return run.id


def test_a_node_whose_rows_are_gone_is_told_to_stop(monkeypatch):
    monkeypatch.setattr(gang, "ENDPOINT_WAIT_S", 2.0)
    run_id = queued_run()
    assert gang.claim_node(run_id, 1, "w1") is not None
    assert gang.node_heartbeat(run_id, 1, 1) is False  # alive, keep going
    assert gang.node_heartbeat(run_id, 1, 2) is True  # no row for node 2: stop
    with db.session_scope() as s:
        s.query(RunNode).delete()
        s.delete(s.get(Run, run_id))
    assert gang.node_heartbeat(run_id, 1, 1) is True
    assert gang.wait_for_endpoint(run_id, 1) is None
    gang.record_node_exit(run_id, 1, 1, 0)  # logged, not raised
