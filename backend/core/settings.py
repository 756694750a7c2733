"""All settings in one place, read from the environment with the prefix ULAB_ (see README)."""
import os
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ULAB_", extra="ignore")

    # Where local state lives on the embedded defaults (SQLite database, broker file, run directories).
    home: Path = Path("var")
    # SQLAlchemy URL; empty means a SQLite file under `home`. Production: postgresql+psycopg://...
    database_url: str = ""
    # Celery broker URL; empty means kombu's SQLAlchemy transport on a SQLite file under `home`.
    broker_url: str = ""
    # The Redis broker's password (docker-compose.yml starts Redis with --requirepass); put into a redis:// broker
    # URL that names none.
    redis_password: str = ""
    # Base URL the worker ships metrics to.
    api_url: str = "http://127.0.0.1:8000"
    # The URL people open the dashboard at, for the links the API hands out (a run's share link); empty: the
    # request's own base URL, which is wrong behind a proxy that does not pass the host on.
    public_url: str = ""
    # Where workers keep run directories (metrics.jsonl, train.log, checkpoints).
    runs_dir: Path | None = None
    # Where model checkpoints live (a directory per model, e.g. HOME/models/meta-llama/Llama-3.1-8B with its
    # config.json and weights); a preset or a run.model_path name is looked up here first. Always an allowed root.
    models_dir: Path | None = None
    # Seconds between worker heartbeats, and how long a silent run may go before it is marked lost.
    heartbeat_s: float = 1.0
    lost_after_s: float = 60.0
    # Seconds between a worker process's own heartbeats (GET /api/workers), and how old the last may be before the
    # worker is shown `lost` and its kernels no longer count at approval or in recommendations.
    worker_heartbeat_s: float = 5.0
    worker_lost_after_s: float = 30.0
    # Seconds between SIGTERM and SIGKILL when a run is cancelled.
    cancel_grace_s: float = 10.0
    # How long a worker keeps trying to report an attempt's start and end (its outcome, a stop rule's alert) while the
    # API cannot be reached (restarting, say), beating meanwhile so the run is not reaped as lost: the run's one
    # outcome record is not dropped for a short outage (worker/supervise.py `deliver`).
    report_retry_s: float = 600.0
    # The GPU type this worker serves and its queue; the API routes a run to the queue of its plan's GPU.
    gpu_type: str = "H100-80GB"
    # Reads (GET, the planner) without a token; writes always need one.
    open_reads: bool = False
    # A worker's own token (role worker, scoped to its queues); empty: the one kept in HOME/worker-token. A worker
    # reaches the service over HTTP only (backend/execution/agent.py) and never mints a token.
    worker_token: str = ""
    # The token of one run's attempt, which a Slurm job is handed by the API that submitted it (a Celery worker gets
    # its attempt's token from its claim instead).
    attempt_token: str = ""
    # Run specs may only name model and data paths under these roots (colon-separated in the environment).
    allowed_roots: str = ""
    # Bounds on what one run may ask for.
    max_seq_len: int = 16 * 1024 * 1024
    max_steps: int = 10_000_000
    max_gpus: int = 4096
    # Approval with force runs a plan the estimate says does not fit, but not one predicted to need more than this
    # per GPU (no GPU has a TiB; a run that asks for it would only fill host memory with ranks that never train).
    max_forced_gib_per_gpu: float = 1024.0
    # Approval of a run whose planner verdict is `tight` needs a probe of its plan that measured it fitting
    # (POST /api/plans/{id}/probe; backend/probes/service.py). Off by default.
    approve_tight_needs_probe: bool = False
    # Request bodies: the most bytes one may have (413 above it), metric ingest batches apart; and how deep JSON may
    # nest (422 below it). A plan is a few kB and 4 levels deep; a worker's batch of 5,000 points about 0.5 MB.
    max_body_bytes: int = 1024 * 1024
    max_ingest_body_bytes: int = 16 * 1024 * 1024
    max_json_depth: int = 32
    # A queued run no worker has claimed for this long has its message sent again (the broker may have lost it);
    # the wait doubles after each re-send. A duplicate is harmless: the claim in the database starts a run once.
    resend_after_s: float = 30.0
    # Trackers a run mirrors to (run.report_to; worker/trackers.py): the MLflow server, the MLflow experiment and W&B
    # project (run.tracker_uri / run.tracker_project override them), where W&B and TensorBoard files go (empty:
    # RUN_DIR/wandb, RUN_DIR/tensorboard), and the wait between tries while a tracker is down (doubling up to 60 s).
    mlflow_tracking_uri: str = ""
    tracker_project: str = "ulysses-lab"
    wandb_dir: str = ""
    tensorboard_dir: str = ""
    tracker_retry_s: float = 2.0
    # Metrics may still be written this long after a run ended (the worker drains what its trainer wrote last).
    ingest_after_end_s: float = 60.0
    # How long a chart answer is served again before it is computed anew (backend/metrics/chart.py): the chart of a
    # live run may be this far behind its ingest (the live stream is not cached); 0: never cached.
    chart_cache_s: float = 1.0
    # The address other nodes reach this worker at, for multi-node rendezvous. Empty: the IPv4 address of
    # `node_interface` if set, else the address this host routes to the broker from (worker/gang.py).
    node_address: str = ""
    # A network interface (e.g. ib0, eth1) whose address the worker advertises when node_address is empty.
    node_interface: str = ""
    # `make gpu-check` results (gpu-*.csv) loaded as measured calibration rows when the API starts.
    calibration_dir: Path = Path("bench/results")
    # Slurm executor (README "Running on a Slurm cluster"). A GPU queue runs on Slurm when
    # ULAB_EXECUTOR_<QUEUE>=slurm (e.g. ULAB_EXECUTOR_GPU_H100_80GB=slurm; `executor_for` reads it); each
    # slurm_* value below may be given per queue the same way (ULAB_SLURM_PARTITION_GPU_H100_80GB=...).
    slurm_partition: str = ""
    slurm_account: str = ""
    slurm_qos: str = ""
    # --time of a job ([days-]hours:minutes:seconds, or minutes); empty: the partition's default.
    slurm_time_limit: str = ""
    # False for a CPU-only partition (no GRES): the job asks for no --gpus-per-node and the trainer uses CPU ranks.
    slurm_gpus: bool = True
    # The cluster's shared filesystem, seen at the same path by the API host and every node: run directories
    # (plan, logs, metrics.jsonl, checkpoints) live here. Empty: runs_dir (then it must be shared).
    slurm_shared_dir: Path | None = None
    # The `ulab` executable on the nodes; empty: the one next to the API's Python.
    slurm_ulab: str = ""
    # Seconds between polls of squeue/scontrol by the API.
    slurm_poll_s: float = 1.0
    # c10d rendezvous port on a multi-node job's first node: this plus the job id modulo 1000.
    slurm_rdzv_port: int = 29400
    # Where the built dashboard is served from.
    frontend_dist: Path = Path(__file__).resolve().parents[2] / "frontend" / "dist"

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.home / 'ulab.db').resolve()}"

    @property
    def resolved_broker_url(self) -> str:
        """The broker URL, with ULAB_REDIS_PASSWORD put into a redis:// URL that carries no password."""
        if not self.broker_url:
            return f"sqla+sqlite:///{(self.home / 'broker.db').resolve()}"
        scheme, sep, rest = self.broker_url.partition("://")
        if self.redis_password and scheme in ("redis", "rediss") and "@" not in rest.split("/", 1)[0]:
            return f"{scheme}{sep}:{quote(self.redis_password, safe='')}@{rest}"
        return self.broker_url

    @property
    def resolved_allowed_roots(self) -> list[Path]:
        """Model and data paths of a run must lie under one of these (default: examples/ and HOME/data)."""
        if self.allowed_roots:
            roots = [Path(p).resolve() for p in self.allowed_roots.split(":") if p]
        else:
            roots = [(Path.cwd() / "examples").resolve(), (self.home / "data").resolve()]
        return roots + [self.resolved_models_dir]

    @property
    def resolved_models_dir(self) -> Path:
        return (self.models_dir or self.home / "models").resolve()

    @property
    def resolved_runs_dir(self) -> Path:
        return (self.runs_dir or self.home / "runs").resolve()

    @property
    def resolved_slurm_shared_dir(self) -> Path:
        return (self.slurm_shared_dir or self.resolved_runs_dir).resolve()

    def per_queue(self, name: str, queue: str) -> str:
        """A setting for one GPU queue: ULAB_<NAME>_<QUEUE> (queue gpu-h100-80gb -> GPU_H100_80GB) if set,
        else the general setting (`executor` has no general setting: celery)."""
        key = f"ULAB_{name.upper()}_{queue.upper().replace('-', '_')}"
        if key in os.environ:
            return os.environ[key]
        return str(getattr(self, name, "celery"))


@lru_cache
def get_settings() -> Settings:
    return Settings()
