"""All settings in one place, read from the environment with the prefix ULAB_ (see README)."""
from functools import lru_cache
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ULAB_", extra="ignore")

    # Where local state lives on the embedded defaults (SQLite database, broker file, run directories).
    home: Path = Path("var")
    # SQLAlchemy URL; empty means a SQLite file under `home`. Production: postgresql+psycopg://...
    database_url: str = ""
    # Celery broker URL; empty means kombu's SQLAlchemy transport on a SQLite file under `home`.
    broker_url: str = ""
    # Base URL the worker ships metrics to.
    api_url: str = "http://127.0.0.1:8000"
    # Where workers keep run directories (metrics.jsonl, train.log, checkpoints).
    runs_dir: Path | None = None
    # Seconds between worker heartbeats, and how long a silent run may go before it is marked lost.
    heartbeat_s: float = 1.0
    lost_after_s: float = 60.0
    # Seconds between SIGTERM and SIGKILL when a run is cancelled.
    cancel_grace_s: float = 10.0
    # The GPU type this worker serves and its queue; the API routes a run to the queue of its plan's GPU.
    gpu_type: str = "H100-80GB"
    # Reads (GET, the planner) without a token; writes always need one.
    open_reads: bool = False
    # The token a worker ships metrics with; empty: the worker mints a worker-role token in the database.
    worker_token: str = ""
    # Run specs may only name model and data paths under these roots (colon-separated in the environment).
    allowed_roots: str = ""
    # Bounds on what one run may ask for.
    max_seq_len: int = 16 * 1024 * 1024
    max_steps: int = 10_000_000
    max_gpus: int = 4096
    # The address other nodes reach this worker at, for multi-node rendezvous (default: this host's name).
    node_address: str = ""
    # Where the built dashboard is served from.
    frontend_dist: Path = Path(__file__).resolve().parents[2] / "frontend" / "dist"

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.home / 'ulab.db').resolve()}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{(self.home / 'broker.db').resolve()}"

    @property
    def resolved_allowed_roots(self) -> list[Path]:
        """Model and data paths of a run must lie under one of these (default: examples/ and HOME/data)."""
        if self.allowed_roots:
            return [Path(p).resolve() for p in self.allowed_roots.split(":") if p]
        return [(Path.cwd() / "examples").resolve(), (self.home / "data").resolve()]

    @property
    def resolved_runs_dir(self) -> Path:
        return (self.runs_dir or self.home / "runs").resolve()


@lru_cache
def get_settings() -> Settings:
    return Settings()
