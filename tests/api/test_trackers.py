"""Mirroring a run to the user's trackers (worker/trackers.py), against the real thing: an `mlflow server` on SQLite
(read back with MLflow's client) and TensorBoard event files (read back with TensorBoard's event reader). The
forwarder's input is what the API stored, so the run here is driven through the API (ingest, finish) without
training: steps 1-5 arrive and go; the tracker goes away; steps 6-10 arrive while it is down; it comes back and the
run ends. Each tracker then has every step once, in order, and the final state."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from backend.core.settings import Settings
from backend.execution import agent
from backend.execution.agent import HttpRunAgent
from tests.api.conftest import as_role
from tests.api.test_alerts import ingest, running_run
from tests.services import free_port, wait_http

STEPS = 10


def points(steps) -> dict:
    """loss on rank 0 and a memory figure on ranks 0 and 1, per step."""
    return {"points": [p for s in steps for p in (
        {"step": s, "name": "loss", "value": 7.0 - 0.1 * s},
        {"step": s, "rank": 0, "name": "peak_allocated_gib", "value": 1.0 + s},
        {"step": s, "rank": 1, "name": "peak_allocated_gib", "value": 2.0 + s})]}


def forwarder(run_id, run_dir: Path, tracker: str, **cfg):
    from worker.trackers import Forwarder, TrackerConfig, read_stored

    config = TrackerConfig(run_id=run_id, run_dir=run_dir, project="ulab-tests", mlflow_uri=cfg.get("uri", ""),
                           wandb_dir=cfg.get("wandb", run_dir / "wandb"),
                           tensorboard_dir=cfg.get("tb", run_dir / "tensorboard"))
    return Forwarder(config, [tracker], read_stored(run_id), retry_s=0.1)


def pump_until_done(fwd, timeout_s=60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not fwd.pump():
        assert time.monotonic() < deadline, fwd.memo
        time.sleep(0.05)


def run_with_outage(client, tokens, tmp_path, tracker, down, up, **cfg):
    """The scenario of the module doc; `down()` and `up()` take the tracker away and bring it back."""
    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path, report_to=[tracker], steps=STEPS)
    run_dir = tmp_path / f"run-{tracker}"
    run_dir.mkdir()
    with pytest.MonkeyPatch.context() as mp:  # the forwarder reads the run over the agent API, as on a worker
        mp.setattr(agent, "get_agent", lambda: HttpRunAgent(Settings(attempt_token=attempt_token(run_id)), client))
        return _run_with_outage(client, admin, run_id, forwarder(run_id, run_dir, tracker, **cfg), tracker, down, up)


def attempt_token(run_id: int) -> str:
    """A token of the run's live attempt, as its claim hands out (running_run claimed it in the database)."""
    from backend.core.db import session_scope
    from backend.execution import attempt_tokens

    with session_scope() as s:
        return attempt_tokens.mint(s, run_id, 1)


def _run_with_outage(client, admin, run_id, fwd, tracker, down, up):
    from backend.runs import transitions
    from backend.runs.states import RunState

    ingest(client, admin, run_id, points(range(1, 6)))
    assert not fwd.pump()
    assert fwd.memo[tracker]["step"] == 4  # step 5 is the newest: its other ranks may still be on their way
    down()
    ingest(client, admin, run_id, points(range(6, STEPS + 1)))
    assert not fwd.pump()
    assert fwd.memo[tracker]["step"] == 4  # nothing was lost: the cursor waits
    up()
    assert transitions.finish(run_id, 1, RunState.SUCCEEDED, None, last_step=STEPS)
    pump_until_done(fwd)
    assert fwd.memo[tracker] == {**fwd.memo[tracker], "step": STEPS, "done": True}
    return run_id


class MlflowServer:
    def __init__(self, home: Path):
        self.home, self.port = home, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> MlflowServer:
        self.launch()
        self.wait()
        return self

    def wait(self) -> None:
        assert self.proc is not None
        wait_http(f"{self.uri}/health", 120, self.proc, self.home / "mlflow.log")

    def launch(self) -> MlflowServer:
        mlflow = Path(sys.executable).parent / "mlflow"
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job-runner processes: not needed
        self.proc = subprocess.Popen(
            [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{self.home / 'mlflow.db'}", "--host",
             "127.0.0.1", "--port", str(self.port), "--workers", "1", "--default-artifact-root",
             str(self.home / "artifacts")], stdout=(self.home / "mlflow.log").open("a"), stderr=subprocess.STDOUT,
            env=env, start_new_session=True)
        return self

    def stop(self) -> None:
        if self.proc is not None:  # the server and its uvicorn worker: its own process group
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            self.proc = None


class Link:
    """The network between the worker and the tracker: a TCP relay that can be cut (connections refused) and
    restored on the same port, so an outage costs no server restart."""

    def __init__(self, target_port: int):
        self.target, self.port = target_port, free_port()
        self.listener: socket.socket | None = None
        self.conns: list[socket.socket] = []

    def up(self) -> None:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", self.port))
        self.listener.listen(16)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def down(self) -> None:
        assert self.listener is not None
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() of its thread, which closes nothing itself
        self.listener.close()
        for c in self.conns:
            c.close()
        self.conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def test_tensorboard_gets_every_step_once_in_order_after_an_outage(client, tokens, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    mount = tmp_path / "tb-mount"  # a shared file system the logs go to, which goes away and comes back
    mount.mkdir()
    logs = mount / "run"
    away = tmp_path / "tb-away"

    def down() -> None:
        mount.rename(away)
        mount.write_text("not mounted")  # mkdir under it fails as on a stale mount

    def up() -> None:
        mount.unlink()
        away.rename(mount)

    run_with_outage(client, tokens, tmp_path, "tensorboard", down, up, tb=logs)
    acc = EventAccumulator(str(logs), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    for key, value in (("loss", lambda s: 7.0 - 0.1 * s), ("peak_allocated_gib/rank1", lambda s: 2.0 + s)):
        events = acc.Tensors(key)  # TensorBoard's own writer stores scalars as tensors
        assert [e.step for e in events] == list(range(1, STEPS + 1)), key
        from tensorboard.util import tensor_util

        values = [float(tensor_util.make_ndarray(e.tensor_proto)) for e in events]
        assert values == pytest.approx([value(s) for s in range(1, STEPS + 1)])
    shutil.rmtree(mount)


def wandb_history(directory: Path) -> list[tuple[int, dict[str, float]]]:
    """The history records of every offline W&B run under `directory`, in file order: W&B's protobuf records
    (wandb.proto.wandb_internal_pb2.Record) in its LevelDB-log framing (wandb 0.31 has no Python reader left:
    `wandb sync` reads these files in its Go core). Header ":W&B", 0xBEE1, version; 32 KiB blocks of records, each
    with a 7-byte header (checksum, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    import json
    import struct

    from wandb.proto import wandb_internal_pb2

    out = []
    for path in sorted(directory.glob("wandb/offline-run-*/run-*.wandb")):
        data = path.read_bytes()
        assert struct.unpack("<4sHB", data[:7])[:2] == (b":W&B", 0xBEE1)
        pos, records, pending = 7, [], b""
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            if left < 7:
                pos += left
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if length == 0 and kind == 0:  # block padding
                pos += left
                continue
            chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind == 1:
                records.append(chunk)
            elif kind in (2, 3):
                pending = (pending if kind == 3 else b"") + chunk
            elif kind == 4:
                records.append(pending + chunk)
        for raw in records:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "history":
                items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
                out.append((record.history.step.num, {k: v for k, v in items.items() if not k.startswith("_")}))
    return out


def test_wandb_offline_gets_every_step_once_in_order_after_an_outage(client, tokens, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    mount = tmp_path / "wb-mount"  # where the W&B files go, which goes away and comes back
    mount.mkdir()
    away = tmp_path / "wb-away"

    def down() -> None:
        mount.rename(away)
        mount.write_text("not mounted")

    def up() -> None:
        mount.unlink()
        away.rename(mount)

    run_with_outage(client, tokens, tmp_path, "wandb", down, up, wandb=mount / "run")
    history = wandb_history(mount / "run")
    assert [step for step, _ in history] == list(range(1, STEPS + 1))
    assert [values["loss"] for _, values in history] == pytest.approx([7.0 - 0.1 * s for s in range(1, STEPS + 1)])
    assert [values["peak_allocated_gib/rank1"] for _, values in history] == \
        pytest.approx([2.0 + s for s in range(1, STEPS + 1)])


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """Launched when the module starts (its start takes ~30 s here), used by the last test."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow")).launch()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _mlflow_starting(mlflow_server):
    """Every test of the module asks for the server, so it starts with the first one."""


def test_mlflow_gets_every_step_once_in_order_after_an_outage(client, tokens, tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    server = mlflow_server
    server.wait()
    link = Link(server.port)
    link.up()
    try:
        run_id = run_with_outage(client, tokens, tmp_path, "mlflow", link.down, link.up,
                                 uri=f"http://127.0.0.1:{link.port}")
        c = MlflowClient(tracking_uri=server.uri)
        exp = c.get_experiment_by_name("ulab-tests")
        [run] = c.search_runs([exp.experiment_id], f"tags.`ulab.run_id` = '{run_id}'")
        for key, value in (("loss", lambda s: 7.0 - 0.1 * s), ("peak_allocated_gib/rank1", lambda s: 2.0 + s)):
            history = c.get_metric_history(run.info.run_id, key)
            assert [m.step for m in history] == list(range(1, STEPS + 1)), key
            assert [m.value for m in history] == pytest.approx([value(s) for s in range(1, STEPS + 1)])
        assert run.data.params["plan.training.seq_len"] == "512"  # the plan as params
        assert run.data.params["plan.run.report_to"] == '["mlflow"]'
        estimate = client.get(f"/api/runs/{run_id}", headers=as_role(client, tokens, "admin")).json()["estimate"]
        memory = estimate["memory"]
        assert run.data.params["estimate.device_total_gib"] == str(memory["device_total_gib"])  # the estimate
        if "device_total_gib_range" in memory:  # and its range
            low, high = memory["device_total_gib_range"]
            params = run.data.params
            assert (params["estimate.device_total_gib_low"], params["estimate.device_total_gib_high"]) == \
                (str(low), str(high))
        assert run.data.tags["ulab.state"] == "succeeded"
        assert run.info.status == "FINISHED"
    finally:
        link.down()


@pytest.mark.parametrize(("names", "steps", "cut_after"), [(10, 251, 1), (10, 251, 2), (1200, 2, 1)],
                         ids=["2500-metrics-cut-after-batch-1", "2500-metrics-cut-after-batch-2",
                              "one-step-of-1200-cut-inside-it"])
def test_mlflow_down_mid_round_still_has_every_step_once(client, tokens, tmp_path, mlflow_server, names, steps,
                                                         cut_after, monkeypatch):
    """A round larger than one log_batch (1,000 metrics): the link to MLflow is cut right after the round's
    `cut_after`-th batch of metrics reached the server, then restored and the run ends. Every metric then has each
    step once: the cursor moved with each batch the server took, and a step larger than a batch, sent again in
    full, is stored once (its points keep the round's timestamp)."""
    from mlflow.tracking import MlflowClient

    from backend.runs import transitions
    from backend.runs.states import RunState
    from worker.trackers import MlflowSink

    server = mlflow_server
    server.wait()
    link = Link(server.port)
    link.up()
    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path, report_to=["mlflow"], steps=steps)
    run_dir = tmp_path / "run-mlflow"
    run_dir.mkdir()
    # the forwarder reads the run over the agent API, as on a worker
    monkeypatch.setattr(agent, "get_agent", lambda: HttpRunAgent(Settings(attempt_token=attempt_token(run_id)), client))
    fwd = forwarder(run_id, run_dir, "mlflow", uri=f"http://127.0.0.1:{link.port}")
    sink = fwd._sinks["mlflow"] = MlflowSink(fwd.cfg, fwd.memo["mlflow"])
    real_log_batch, sent = sink.client.log_batch, []

    def log_batch(run, metrics=(), params=(), tags=()):  # the real call; the link goes down after the chosen one
        real_log_batch(run, metrics=metrics, params=params, tags=tags)
        if metrics:
            sent.append(len(metrics))
            if len(sent) == cut_after:
                link.down()

    sink.client.log_batch = log_batch
    try:
        ingest(client, admin, run_id, {"points": [{"step": s, "name": f"m{i}", "value": s + i / 10_000}
                                                  for s in range(1, steps + 1) for i in range(names)]})
        assert not fwd.pump()  # the newest step stays back; the link is cut mid-round
        expected_cursor = {(10, 1): 100, (10, 2): 200, (1200, 1): 0}[(names, cut_after)]
        assert fwd.memo["mlflow"]["step"] == expected_cursor
        link.up()
        assert transitions.finish(run_id, 1, RunState.SUCCEEDED, None, last_step=steps)
        pump_until_done(fwd)
        assert sent[:cut_after] == [1000] * cut_after
        c = MlflowClient(tracking_uri=server.uri)
        [run] = c.search_runs([c.get_experiment_by_name("ulab-tests").experiment_id],
                              f"tags.`ulab.run_id` = '{run_id}'")
        for i in (0, names // 2, names - 1):
            history = c.get_metric_history(run.info.run_id, f"m{i}")
            assert [m.step for m in history] == list(range(1, steps + 1)), f"m{i}"
            assert [m.value for m in history] == pytest.approx([s + i / 10_000 for s in range(1, steps + 1)])
        assert run.info.status == "FINISHED"
    finally:
        link.down()
