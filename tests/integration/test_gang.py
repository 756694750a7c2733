"""A run over two "nodes": two worker processes each take one node task of the gang, meet at the c10d
rendezvous node 0 publishes, and train with SP=2 across them (one CPU rank per node)."""
import time

import pytest

from tests.services import ULAB, Service, Stack, postgres_database, redis_database
from tests.tiny import submit, tiny_plan, wait_for

pytestmark = pytest.mark.slow


def wait_ready(service: Service, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while "ready." not in service.log.read_text(errors="replace"):
        assert service.proc.poll() is None, service.log.read_text()[-2000:]
        assert time.monotonic() < end, "worker not ready"
        time.sleep(0.3)


def test_two_node_run_is_a_gang_of_node_tasks(tmp_path, corpus):
    with postgres_database() as pg, redis_database() as broker:
        s = Stack(tmp_path / "gang", pg, broker, ULAB_NODE_ADDRESS="127.0.0.1")
        s.worker.cmd += ["--gpus", "1"]
        s.start()
        second = Service("worker2", [str(ULAB), "worker", "--gpu-type", "H100-80GB", "--gpus", "1"], s.worker.env,
                         s.home)  # the first worker's: no database URL, a worker token of the queue
        second.start()
        try:
            wait_ready(second)
            plan = tiny_plan(sp_size=2)
            plan["hardware"].update(gpus_per_node=1, num_nodes=2)
            with s.client() as api:
                run = submit(api, plan, {"steps": 6, "data": {"path": str(corpus)}}, name="two-nodes")
                done = wait_for(api, run["id"], {"succeeded"}, timeout_s=300)
                q = api.get(f"/api/runs/{run['id']}/metrics", params={"name": "loss"}).json()
                assert q["series"][0]["step"] == [1, 2, 3, 4, 5, 6]
                ranks = api.get(f"/api/runs/{run['id']}/metrics", params={"name": "peak_allocated_gib"}).json()
                assert [x["rank"] for x in ranks["series"]] == [0, 1]  # two ranks, one per node
            run_dir = tmp_path / "gang" / "runs" / f"run-{run['id']}"
            assert "--- attempt 1 on node 1 ---" in (run_dir / "train-node1.log").read_text()
            logs = s.worker.log.read_text() + second.log.read_text()
            assert f"run {run['id']} node 0: started trainer" in logs
            assert f"run {run['id']} node 1: started" in logs
            assert done["worker"]
        finally:
            second.stop()
            s.stop()
