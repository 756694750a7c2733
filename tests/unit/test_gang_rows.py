"""A node worker of a gang whose run or node row is gone (removed by hand, or a database restored from an older
backup) stops cleanly instead of dying on a None: heartbeat says stop, the endpoint wait ends, the exit is logged."""
import pytest

from backend.core import db
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.nodes import RunNode
from worker import gang

pytestmark = pytest.mark.usefixtures("sqlite_db")


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
