"""Mirror a run to the user's own trackers (`run.report_to`: MLflow, W&B, TensorBoard), through each one's client.

The worker, not the ranks, forwards what the API stored: the metric points in the database, the plan (as params),
the estimate and its range, the alerts (as tags) and the final state. Each tracker has its own cursor, the last step
it took, kept in RUN_DIR/trackers.json: a round sends the steps after it, in order, each once. The cursor moves with
every part of a round the tracker took (MLflow's batches of 1,000 metrics, W&B's round file once it is finished), so
a tracker that goes down mid-round is sent only what it has not got; a tracker that is down raises, keeps its
cursor and is tried again after a wait that doubles (up to 60 s), so what it missed goes when it is back. MLflow's
points of a round carry one timestamp, kept with the cursor until the round is through: a batch sent again (a step
larger than a batch, a reply lost on the way back) is the same (key, step, timestamp, value), which MLflow stores
once. It runs in its own thread: a tracker never fails or slows the run.

A step is sent once all of it is stored: while the run lives, only steps below the newest one (the ranks' points of
the newest step may still be on their way); once the run has ended, every step.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from plan.model import Plan

log = logging.getLogger(__name__)
STATE_FILE = "trackers.json"
MAX_RETRY_S = 60.0
TRACKERS = ("mlflow", "wandb", "tensorboard")
# The state a run ends in, as each tracker says it.
MLFLOW_STATUS = {"succeeded": "FINISHED", "cancelled": "KILLED"}  # the rest: FAILED


@dataclass
class Stored:
    """What the API stored of a run, as a round reads it."""

    state: str
    ended: bool
    plan: dict
    estimate: dict | None
    alerts: dict[str, str]
    steps: list[tuple[int, dict[str, float]]]  # (step, {metric key: value}) after the cursor, step order


def metric_key(name: str, rank: int) -> str:
    """`loss` for rank 0, `peak_allocated_gib/rank1` for another rank's figure."""
    return name if rank == 0 else f"{name}/rank{rank}"


def flat(prefix: str, value: Any) -> dict[str, str]:
    """{"training.seq_len": "65536", ...}: a nested dict as params."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(flat(f"{prefix}.{k}" if prefix else str(k), v))
        return out
    return {prefix: json.dumps(value) if isinstance(value, list) else str(value)}


def estimate_params(estimate: dict | None) -> dict[str, str]:
    """The estimate's point figures and ranges (plan-v1 Estimate), as params."""
    if not estimate or not estimate.get("valid"):
        return {}
    out: dict[str, str] = {}
    for section, keys in (("memory", ("device_total_gib", "peak_allocated_gib", "verdict", "fits")),
                          ("throughput", ("step_time_s", "tokens_per_s", "mfu"))):
        for key in keys:
            part = estimate.get(section) or {}
            if key in part:
                out[f"estimate.{key}"] = str(part[key])
            rng = part.get(f"{key}_range")
            if rng:
                out[f"estimate.{key}_low"], out[f"estimate.{key}_high"] = str(rng[0]), str(rng[1])
    return out


class Sink(Protocol):
    name: str

    def send(self, stored: Stored, first: bool, delivered: Callable[[int], None]) -> None:
        """Send the steps (and, first, the params; at the end, the final state), calling `delivered(step)` once the
        tracker holds every step up to `step`. Raises if the tracker is down."""


MLFLOW_BATCH = 1000  # metrics a log_batch call may carry (MLflow's MAX_METRICS_PER_BATCH, mlflow/utils/validation.py)


def batches(steps: list[tuple[int, dict[str, float]]], size: int) -> Iterable[tuple[list[tuple[int, str, float]],
                                                                                   int | None]]:
    """The steps' (step, key, value) in batches of at most `size`, each with the last step it completes (None for
    a part of a step larger than a batch, before its last part); a batch ends at a step's end where it can."""
    batch: list[tuple[int, str, float]] = []
    done: int | None = None
    for step, values in steps:
        items = [(step, key, value) for key, value in values.items()]
        if batch and len(batch) + len(items) > size:
            yield batch, done
            batch, done = [], None
        if len(items) > size:
            for i in range(0, len(items), size):
                yield items[i:i + size], step if i + size >= len(items) else None
            continue
        batch += items
        done = step
    if batch:
        yield batch, done


@dataclass
class TrackerConfig:
    run_id: int
    run_dir: Path
    project: str
    mlflow_uri: str
    wandb_dir: Path
    tensorboard_dir: Path


class MlflowSink:
    name = "mlflow"

    def __init__(self, cfg: TrackerConfig, state: dict):
        # The client's own retries wait minutes on a server that is down; the forwarder retries instead.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.tracking import MlflowClient

        self.cfg, self.memo = cfg, state
        self.client = MlflowClient(tracking_uri=cfg.mlflow_uri)

    def _run(self) -> str:
        if not self.memo.get("run"):
            c = self.client
            exp = c.get_experiment_by_name(self.cfg.project)
            exp_id = exp.experiment_id if exp is not None else c.create_experiment(self.cfg.project)
            found = c.search_runs([exp_id], f"tags.`ulab.run_id` = '{self.cfg.run_id}'", max_results=1)
            self.memo["run"] = found[0].info.run_id if found else c.create_run(
                exp_id, run_name=f"ulab-run-{self.cfg.run_id}", tags={"ulab.run_id": str(self.cfg.run_id)}).info.run_id
        return self.memo["run"]

    def send(self, stored: Stored, first: bool, delivered: Callable[[int], None]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        run = self._run()
        # one timestamp for the round's points until all of them went: a batch sent again is then the same metrics
        stamp = self.memo.setdefault("ms", int(time.time() * 1000))
        if first:
            params = [Param(k, v[:6000]) for k, v in {**flat("plan", stored.plan),
                                                     **estimate_params(stored.estimate)}.items()]
            for i in range(0, len(params), 100):  # MLflow takes 100 params a batch
                self.client.log_batch(run, params=params[i:i + 100])
        for batch, done in batches(stored.steps, MLFLOW_BATCH):
            self.client.log_batch(run, metrics=[Metric(key, value, stamp, step) for step, key, value in batch])
            if done is not None:
                delivered(done)
        self.memo.pop("ms", None)
        tags = [RunTag(f"ulab.alert.{k}", v) for k, v in stored.alerts.items()] + [RunTag("ulab.state", stored.state)]
        self.client.log_batch(run, tags=tags)
        if stored.ended:
            self.client.set_terminated(run, MLFLOW_STATUS.get(stored.state, "FAILED"))


class WandbSink:
    """W&B through `wandb` (WANDB_MODE=offline writes the run under `dir` for `wandb sync`). A W&B run is opened
    for each round and finished at its end, resuming the same id, so a tracker that went away mid-run is simply
    opened again; each round's file is a complete offline run."""

    name = "wandb"

    def __init__(self, cfg: TrackerConfig, state: dict):
        self.cfg, self.memo = cfg, state
        self.opened = 0

    def send(self, stored: Stored, first: bool, delivered: Callable[[int], None]) -> None:
        import wandb

        self.cfg.wandb_dir.mkdir(parents=True, exist_ok=True)
        # W&B names an offline run's directory by the second it opened (offline-run-YYYYmmdd_HHMMSS-<id>): two rounds
        # in one second would write the same files, so a round waits for the next second (this thread only)
        while int(time.time()) == self.opened:
            time.sleep(1.0 - time.time() % 1.0 + 0.01)
        run = wandb.init(project=self.cfg.project, id=f"ulab-run-{self.cfg.run_id}", name=f"ulab-run-{self.cfg.run_id}",
                         dir=str(self.cfg.wandb_dir), resume="allow", reinit="create_new",
                         config={**flat("plan", stored.plan), **estimate_params(stored.estimate)} if first else None,
                         settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
        self.opened = int(time.time())
        logged: int | None = None  # the last step in the round's file: it holds them once the run is finished
        try:
            for step, values in stored.steps:
                run.log(values, step=step)
                logged = step
            run.summary.update({"ulab.state": stored.state, **{f"ulab.alert.{k}": v for k, v in stored.alerts.items()}})
            if stored.alerts:
                run.tags = tuple(sorted(set(run.tags or ()) | {f"alert:{k}" for k in stored.alerts}))
        finally:
            run.finish(exit_code=0 if stored.state == "succeeded" or not stored.ended else 1)
            wandb.teardown()  # waits for W&B's core process to have written the round: only then is it sent
            if logged is not None:
                delivered(logged)


class TensorBoardSink:
    """Event files through TensorBoard's own writer (tensorboard.summary.Writer): one file per round, so a round
    that fails leaves nothing half written (its file is removed)."""

    name = "tensorboard"

    def __init__(self, cfg: TrackerConfig, state: dict):
        self.cfg, self.memo = cfg, state

    def send(self, stored: Stored, first: bool, delivered: Callable[[int], None]) -> None:
        """All of the round or none of it: its steps are delivered when the call returns."""
        from tensorboard.summary import Writer

        directory = self.cfg.tensorboard_dir
        before = set(directory.iterdir()) if directory.is_dir() else set()
        try:
            writer = Writer(str(directory))
            for step, values in stored.steps:
                for key, value in values.items():
                    writer.add_scalar(key, value, step)
            writer.close()
        except BaseException:
            for path in (set(directory.iterdir()) if directory.is_dir() else set()) - before:
                path.unlink(missing_ok=True)
            raise


SINKS: dict[str, Callable[[TrackerConfig, dict], Sink]] = {
    "mlflow": MlflowSink, "wandb": WandbSink, "tensorboard": TensorBoardSink}


@dataclass
class Forwarder:
    """Rounds of forwarding for one run: `pump()` once, or `start()` a thread that pumps until everything, the
    final state included, reached every tracker."""

    cfg: TrackerConfig
    report_to: list[str]
    read: Callable[[int], Stored]  # after_step -> what the API stored
    retry_s: float = 2.0
    memo: dict = field(default_factory=dict)
    _sinks: dict[str, Sink] = field(default_factory=dict)
    _wait: dict[str, float] = field(default_factory=dict)
    _next: dict[str, float] = field(default_factory=dict)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        path = self.cfg.run_dir / STATE_FILE
        if path.is_file():
            self.memo = json.loads(path.read_text())
        for name in self.report_to:
            self.memo.setdefault(name, {"step": 0, "params": False, "done": False})

    def _save(self) -> None:
        path = self.cfg.run_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.memo))
        tmp.replace(path)

    @property
    def done(self) -> bool:
        return all(self.memo[n]["done"] for n in self.report_to)

    def pump(self) -> bool:
        """One round for each tracker that is due; answers whether every tracker has everything."""
        for name in self.report_to:
            st = self.memo[name]
            if st["done"] or time.monotonic() < self._next.get(name, 0.0):
                continue
            stored = self.read(st["step"])

            def delivered(step: int, st: dict = st) -> None:  # the cursor of a part the tracker holds
                st["step"] = step
                self._save()

            try:
                sink = self._sinks.get(name) or SINKS[name](self.cfg, st)
                self._sinks[name] = sink
                sink.send(stored, first=not st["params"], delivered=delivered)
            except Exception as e:  # a tracker that is down is tried again, never fails the run
                wait = min(MAX_RETRY_S, self._wait.get(name, self.retry_s / 2) * 2)
                self._wait[name], self._next[name] = wait, time.monotonic() + wait
                log.warning("run %s: %s is not reachable (%s); trying again in %.0f s", self.cfg.run_id, name,
                            str(e).splitlines()[0][:200] if str(e) else type(e).__name__, wait)
                continue
            self._wait.pop(name, None)
            st["params"] = True
            if stored.steps:
                st["step"] = stored.steps[-1][0]
            st["done"] = stored.ended
            self._save()
        return self.done

    def start(self, interval_s: float = 5.0) -> Forwarder:
        def loop() -> None:
            while True:
                try:
                    if self.pump():
                        return
                except Exception:  # the database may be briefly away
                    log.exception("run %s: forwarding to trackers failed", self.cfg.run_id)
                time.sleep(min([interval_s] + [max(0.1, t - time.monotonic()) for t in self._next.values()]))

        self._thread = threading.Thread(target=loop, name=f"trackers-{self.cfg.run_id}", daemon=True)
        self._thread.start()
        return self


def read_stored(run_id: int) -> Callable[[int], Stored]:
    """What the API stored of a run (through the seam, backend/execution/agent.py), from the step after `after`."""
    from backend.execution.agent import get_agent

    def read(after: int) -> Stored:
        got = get_agent().stored(run_id, after)
        return Stored(state=got.state, ended=got.ended, plan=got.plan, estimate=got.estimate, alerts=got.alerts,
                      steps=_by_step(got.rows))

    return read


def _by_step(rows: Iterable[tuple[int, int, str, float]]) -> list[tuple[int, dict[str, float]]]:
    out: list[tuple[int, dict[str, float]]] = []
    for step, rank, name, value in rows:
        if not out or out[-1][0] != step:
            out.append((step, {}))
        out[-1][1][metric_key(name, rank)] = value
    return out


def forwarder_for(run_id: int, plan: Plan, run_dir: Path, settings: Any) -> Forwarder | None:
    """The forwarder of a run whose plan has `run.report_to`; None without one."""
    run = plan.run
    report_to: list[str] = [t for t in (run.report_to if run is not None else []) if t in TRACKERS]
    if run is None or not report_to:
        return None
    cfg = TrackerConfig(run_id=run_id, run_dir=Path(run_dir), project=run.tracker_project or
                        settings.tracker_project, mlflow_uri=run.tracker_uri or settings.mlflow_tracking_uri,
                        wandb_dir=Path(settings.wandb_dir or Path(run_dir) / "wandb"),
                        tensorboard_dir=Path(settings.tensorboard_dir or Path(run_dir) / "tensorboard"))
    return Forwarder(cfg, report_to, read_stored(run_id), retry_s=settings.tracker_retry_s)
