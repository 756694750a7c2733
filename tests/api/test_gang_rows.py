"""A node worker of a gang whose run or node row is gone (removed by hand, or a database restored from an older
backup) stops cleanly instead of dying on a None: heartbeat says stop, the endpoint wait ends, the exit is dropped.
The node's calls go over the agent API, as a worker's do."""
from backend.core import db
from backend.core.settings import Settings
from backend.execution.agent import HttpRunAgent
from backend.runs.models import Run
from backend.runs.nodes import RunNode
from tests.api.test_token_scope import queued_run
from worker import gang


def test_a_node_whose_rows_are_gone_is_told_to_stop(client, tokens, tmp_path, monkeypatch):
    agent = HttpRunAgent(Settings(worker_token=tokens["worker"]), client=client)
    monkeypatch.setattr(gang, "get_agent", lambda: agent)
    monkeypatch.setattr(gang, "ENDPOINT_WAIT_S", 2.0)
    run_id = queued_run(client, tokens, tmp_path)
    assert gang.claim_node(run_id, 1, "w1") is not None
    assert gang.node_heartbeat(run_id, 1, 1) is False  # alive, keep going
    with db.session_scope() as s:
        s.query(RunNode).delete()
    assert gang.node_heartbeat(run_id, 1, 1) is True  # its row is gone: stop
    with db.session_scope() as s:
        s.delete(s.get(Run, run_id))
    assert gang.node_heartbeat(run_id, 1, 1) is True  # the run is gone (and the token with it): stop
    assert gang.wait_for_endpoint(run_id, 1) is None
    gang.record_node_exit(run_id, 1, 1, 0)  # dropped, not raised
