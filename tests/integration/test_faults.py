"""Fault tests of the run lifecycle against real processes: the broker flushed with runs queued, the same task
delivered twice, the API down for 20 s while a run ships metrics, torchrun killed before the first checkpoint and
the run retried, and the run directory's disk filling up. (A worker killed mid-run, lost and resumed from its
checkpoint: tests/integration/test_supervision.py.)"""
import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from sqlalchemy import create_engine, text

from tests.services import REPO, Stack, forget_messages, own_stack, wait_http
from tests.tiny import submit, tiny_plan, wait_for
from worker.trainer.attempt import ATTEMPT_ENV, RUN_LOCK_ENV, lock_file, read_metrics

pytestmark = pytest.mark.slow
LOST_AFTER_S = 8
RESEND_AFTER_S = 3


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """A stack of its own (database, Redis db, API, worker) that these tests may break."""
    with own_stack(tmp_path_factory.mktemp("faults"), ULAB_LOST_AFTER_S=str(LOST_AFTER_S),
                   ULAB_RESEND_AFTER_S=str(RESEND_AFTER_S)) as s:
        yield s


def steps_of(api, run_id: int, name: str = "loss") -> list[int]:
    q = api.get(f"/api/runs/{run_id}/metrics", params={"name": name, "points": 10_000}).json()
    return q["series"][0]["step"] if q["series"] else []


def attempt_starts(run_dir: str) -> int:
    with open(f"{run_dir}/train.log") as f:
        return sum(line.startswith("--- attempt") for line in f)


def send_task(stack: Stack, run_id: int) -> None:
    """Put one more "execute run N" message on the broker, as a redelivery would."""
    subprocess.run([sys.executable, "-c", f"from backend.core.queue import send_execute_run; "
                    f"send_execute_run({run_id}, 'H100-80GB')"], env=stack.env, cwd=REPO, check=True, timeout=60)


def in_log(log: Path, text: str, timeout_s: float = 10, times: int = 1) -> None:
    """Wait until `text` is in the log at least `times` times."""
    end = time.monotonic() + timeout_s
    while log.read_text().count(text) < times:
        assert time.monotonic() < end, f"not {times} times in {log.name} after {timeout_s} s: {text}"
        time.sleep(0.2)


def test_flushed_broker_queued_run_is_resent_and_duplicates_run_it_once(faults, corpus):
    """The broker forgets the queued run's message twice. The first time the API keeps running: its supervision loop
    re-sends the run once it stayed queued past ULAB_RESEND_AFTER_S. The second time the API restarts: on start-up
    it re-sends what the database says is queued. Then the same message twice more, as a redelivery would. With all
    those duplicates on the queue, the run starts once (the claim in the database). One rank: ranks do not matter
    here."""
    api = faults.api_client
    faults.worker.stop()
    run = submit(api, tiny_plan(sp_size=1), {"steps": 4, "data": {"path": str(corpus)}}, name="flushed")
    forget_messages(faults.broker)  # the message is gone; the API keeps running
    # several re-sends while no worker listens (after RESEND_AFTER_S, then as long again): duplicates on the queue
    in_log(faults.api.log, f"re-sent queued runs no worker claimed within ULAB_RESEND_AFTER_S: [{run['id']}]",
           timeout_s=RESEND_AFTER_S * 3 + 30, times=2)
    assert api.get(f"/api/runs/{run['id']}").json()["state"] == "queued"
    forget_messages(faults.broker)
    faults.api.stop()
    faults.api.start()  # on start-up the API re-sends what the database says is queued
    wait_http(f"{faults.url}/api/health", 60, faults.api.proc, faults.api.log)
    in_log(faults.api.log, f"re-sent 1 queued runs on start-up: [{run['id']}]")
    send_task(faults, run["id"])  # and the same message twice more: a redelivery
    send_task(faults, run["id"])
    faults.worker.start()
    faults.wait_worker_ready()
    done = wait_for(api, run["id"], {"succeeded"}, timeout_s=240)
    assert done["attempt"] == 1
    assert len(done["attempts"]) == 1
    assert attempt_starts(f"{faults.home}/runs/run-{run['id']}") == 1, "the trainer started more than once"
    assert steps_of(api, run["id"]) == [1, 2, 3, 4]
    in_log(faults.worker.log, f"run {run['id']} is not queued", timeout_s=30, times=2)  # it takes the duplicates


def last_step_written(metrics_file: Path) -> int:
    if not metrics_file.is_file():
        return 0
    lines = [x for x in metrics_file.read_text().splitlines() if x.strip()]
    return json.loads(lines[-1])["step"] if lines else 0


def test_api_down_for_20s_loses_no_metric_point(faults, corpus):
    """The API goes away mid-run and stays away until the trainer has finished and the worker has been draining
    for longer than the reaper's limit: the worker keeps beating while it waits, so the run is not marked
    lost, and every point reaches the database once the API is back."""
    api, steps = faults.api_client, 40
    run = submit(api, tiny_plan(sp_size=1), {"steps": steps, "data": {"path": str(corpus)}}, name="api-outage")
    # down as soon as the trainer is launched: its start (torchrun, the ranks' imports, DeepSpeed) takes seconds
    # and its 40 tiny steps about one, too short for a step seen through the API (one heartbeat a second)
    wait_for(api, run["id"], {"running"}, timeout_s=120)
    faults.api.stop(sig=signal.SIGKILL)
    down_at = time.monotonic()
    metrics_file = Path(faults.home) / "runs" / f"run-{run['id']}" / "metrics.jsonl"
    assert last_step_written(metrics_file) < steps, "the trainer had finished before the API went down"
    while last_step_written(metrics_file) < steps:
        assert time.monotonic() - down_at < 300, "the trainer did not finish while the API was down"
        time.sleep(0.5)
    trainer_done = time.monotonic()
    time.sleep(max(20 - (trainer_done - down_at), LOST_AFTER_S + 4))
    faults.api.start()
    wait_http(f"{faults.url}/api/health", 60, faults.api.proc, faults.api.log)
    done = wait_for(api, run["id"], {"succeeded"}, timeout_s=120)
    assert [a["state"] for a in done["attempts"]] == ["succeeded"]
    assert steps_of(api, run["id"]) == list(range(1, steps + 1))
    assert steps_of(api, run["id"], "grad_norm") == list(range(1, steps + 1))


def rank_parents(run_dir: Path) -> set[int]:
    """The pid of the process that started the run's ranks (torchrun): the parent of every process of the run
    directory's attempt that has LOCAL_RANK in its environment."""
    lock, parents = str(lock_file(run_dir)), set()
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if env.get(RUN_LOCK_ENV) == lock and ATTEMPT_ENV in env and "LOCAL_RANK" in env:
                parents.add(p.ppid())
        except psutil.Error:
            continue
    return parents


def stored_rows(stack, run_id: int, columns: str = "step, wall_time") -> list[tuple]:
    """`columns` of every stored loss point (rank 0), in step order, read from the database."""
    engine = create_engine(stack.database_url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                f"SELECT {columns} FROM metrics WHERE run_id = :r AND name = 'loss' AND rank = 0 ORDER BY step"),
                {"r": run_id})]
    finally:
        engine.dispose()


def test_torchrun_sigkill_before_a_checkpoint_then_retry_stores_every_step_once_from_the_retrained_attempt(
        faults, corpus):
    """Torchrun SIGKILLed before the first checkpoint, the run retried; attempt 2 trains
    from scratch. Every step 1..N is stored once, and each stored row is attempt 2's (its wall time is the one in
    attempt 2's metrics file), not attempt 1's. The first attempt's reason names the signal, not torchrun's
    banner."""
    api, steps = faults.api_client, 40
    run = submit(api, tiny_plan(), {"steps": steps, "checkpoint_every": 0, "data": {"path": str(corpus)}},
                 name="torchrun-killed")
    run_dir = Path(faults.home) / "runs" / f"run-{run['id']}"
    end = time.monotonic() + 300  # the file, not the API: a tiny step takes a fraction of a second
    while not (records := read_metrics(run_dir)) or records[-1]["step"] < 3:
        assert time.monotonic() < end, "step 3 not written"
        time.sleep(0.05)
    torchrun = rank_parents(run_dir)
    assert len(torchrun) == 1, torchrun
    os.kill(torchrun.pop(), signal.SIGKILL)
    failed = wait_for(api, run["id"], {"failed"}, timeout_s=120)
    assert 3 <= read_metrics(run_dir)[-1]["step"] < steps, "attempt 1 finished before torchrun was killed"
    r = api.post(f"/api/runs/{run['id']}/retry")
    assert r.status_code == 200, r.text
    done = wait_for(api, run["id"], {"succeeded"}, timeout_s=240)
    assert [a["state"] for a in done["attempts"]] == ["failed", "succeeded"]
    rows = stored_rows(faults, run["id"])
    assert [step for step, _ in rows] == list(range(1, steps + 1))
    retrained = {r["step"]: r["time"] for r in read_metrics(run_dir)}  # the newest attempt's lines
    assert [wall for _, wall in rows] == [retrained[s] for s in range(1, steps + 1)], \
        "rows of steps attempt 2 retrained hold attempt 1's values"
    assert {attempt for (attempt,) in stored_rows(faults, run["id"], "attempt")} == {2}
    assert failed["exit_reason"].splitlines()[0].startswith("torchrun was killed by SIGKILL"), failed["exit_reason"]


@contextlib.contextmanager
def small_disk(path: Path, size: str = "32m"):
    """A tmpfs of `size` mounted at `path` (root only; the test machine runs as root)."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(reason=f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> None:
    """Fill the disk up. The run may have filled it already (its packed data, logs and metrics lines: seen once,
    when the API reported step 3 late): then it stays full, as the test wants, and no filler file can be made."""
    try:
        # unbuffered: a buffered file keeps the part of a write that did not fit and raises ENOSPC again on close
        f = open(disk / "filler", "wb", buffering=0)  # closed below
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        return
    with f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * (1 << 16))


@pytest.mark.parametrize("used_kib", [0, 4, 8, 12, 36])
def test_fill_leaves_the_disk_full_whatever_space_is_left(tmp_path, used_kib):
    """fill() ends with the disk full and raises nothing, also when the space left is no whole number of its
    64 KiB writes (a buffered file kept the part that did not fit and raised ENOSPC again when it closed)."""
    with small_disk(tmp_path / "disk", "200k") as disk:
        (disk / "used").write_bytes(b"x" * (used_kib << 10))
        fill(disk)
        with pytest.raises(OSError) as e, open(disk / "one-more", "wb", buffering=0) as f:
            f.write(b"\0" * 4096)
        assert e.value.errno == errno.ENOSPC


def test_a_full_disk_is_reported_as_no_space_left_on_device(faults, corpus):
    """The run directory's disk fills up mid-run: train.log and the outcome record can no longer be written there,
    and the ranks fail each in its own way. The reason's first line says "no space left on device": the failing
    rank's outcome record, kept outside the run directory too. One rank: ranks do not matter
    here."""
    api = faults.api_client
    run = submit(api, tiny_plan(sp_size=1), {"steps": 3000, "checkpoint_every": 0, "data": {"path": str(corpus)}},
                 name="disk-full", approve=False)  # its packed data (3000 x 512 tokens) fits the 32 MiB disk
    with small_disk(Path(faults.home) / "runs" / f"run-{run['id']}") as disk:
        assert api.post(f"/api/runs/{run['id']}/approve").status_code == 200
        end = time.monotonic() + 300
        while (now := api.get(f"/api/runs/{run['id']}").json())["last_step"] < 3:
            assert now["state"] not in ("failed", "succeeded", "cancelled", "lost"), now
            assert time.monotonic() < end, f"run {run['id']} did not reach step 3"
            time.sleep(0.3)
        fill(disk)
        failed = wait_for(api, run["id"], {"failed"}, timeout_s=180)
    first = failed["exit_reason"].splitlines()[0]
    assert first.startswith("no space left on device"), failed["exit_reason"]
