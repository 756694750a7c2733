"""Real services for tests: a fresh PostgreSQL database, a Redis database, the API and Celery worker processes."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from worker.trainer.net import free_port

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ULAB = BIN / "ulab"
PG_ADMIN_URL = os.environ.get("ULAB_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("ULAB_TEST_REDIS", "redis://127.0.0.1:6379")
REDIS_LOCK_KEY = b"ulab-test-lock"


@contextmanager
def postgres_database():
    """A new, empty PostgreSQL database for this test session; dropped afterwards."""
    import psycopg

    name = f"ulab_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def redis_database(first: int = 1):
    """A Redis logical database of its own (1-15, trying `first` first), emptied before and after. A lock key
    claims it, so test sessions running at the same time (two checkouts on one machine) never share a queue."""
    import redis

    token = uuid.uuid4().hex
    for db in [*range(first, 16), *range(1, first)]:
        client = redis.Redis.from_url(f"{REDIS_URL}/{db}")
        if client.set(REDIS_LOCK_KEY, token, nx=True, ex=3600):
            if not any(client.scan_iter(match="_kombu.binding.*")):
                break
            # a session whose lock was flushed away still has its queues here: leave our lock to guard it
        client.close()
    else:
        raise RuntimeError("every Redis database 1-15 is locked by another test session")
    forget_messages(f"{REDIS_URL}/{db}")
    try:
        yield f"{REDIS_URL}/{db}"
    finally:
        client.flushdb()
        client.close()


def forget_messages(url: str) -> None:
    """Empty a test's Redis database but keep its lock key (a FLUSHDB would drop it, and another test session
    would then take the database while this one still uses it: two workers on one queue)."""
    import redis

    client = redis.Redis.from_url(url)
    for key in client.scan_iter():
        if key != REDIS_LOCK_KEY:
            client.delete(key)
    client.close()


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}: {log.read_text()[-3000:] if log else ''}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer in {timeout_s}s: {log.read_text()[-3000:] if log else ''}")


class Service:
    """A child process with its output in a log file; stopped (whole process group) on exit."""

    def __init__(self, name: str, cmd: list[str], env: dict, log_dir: Path):
        self.name, self.cmd, self.env = name, cmd, env
        self.log = log_dir / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.started_at_byte = 0  # where the latest start's output begins in the log (a restart appends)

    def start(self) -> Service:
        with self.log.open("ab") as out:
            self.started_at_byte = out.tell()
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=REPO)
        return self

    def output(self) -> str:
        """What the latest start wrote to the log."""
        with self.log.open("rb") as f:
            f.seek(self.started_at_byte)
            return f.read().decode(errors="replace")

    def stop(self, sig: int = 15, timeout_s: float = 20) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        except ProcessLookupError:
            pass


def service_env(home: Path, database_url: str, broker_url: str, api_url: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ULAB_")}
    env.update(ULAB_HOME=str(home), ULAB_DATABASE_URL=database_url, ULAB_BROKER_URL=broker_url,
               ULAB_API_URL=api_url, PYTHONUNBUFFERED="1", **extra)
    return env


WORKER_QUEUE = "gpu-h100-80gb"  # the test worker's (--gpu-type H100-80GB)


def worker_env(env: dict) -> dict:
    """A worker's environment: the service's without its database URL (workers speak HTTP only)."""
    return {k: v for k, v in env.items() if k != "ULAB_DATABASE_URL"}


class Stack:
    """The API (and optionally a Celery worker) as real processes on the given database and broker.
    Run specs may name paths under the system temp directory (where tests write their data)."""

    def __init__(self, home: Path, database_url: str, broker_url: str, worker: bool = True, **settings: str):
        home.mkdir(parents=True, exist_ok=True)
        self.home, self.port = home, free_port()
        self.database_url, self.broker = database_url, broker_url
        self.api_client: httpx.Client | None = None  # own_stack's admin client
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = service_env(home, database_url, broker_url, self.url, ULAB_CANCEL_GRACE_S="8",
                               ULAB_ALLOWED_ROOTS=tempfile.gettempdir(), **settings)
        self.admin_token = ""
        self.api = Service("api", [str(ULAB), "serve", "--port", str(self.port)], self.env, home)
        # the worker holds no database URL: its own token (made in start) and the API's address
        self.worker = Service("worker", [str(ULAB), "worker", "--gpu-type", "H100-80GB", "--loglevel", "info"],
                              worker_env(self.env), home) if worker else None

    def start(self) -> Stack:
        self.api.start()
        wait_http(f"{self.url}/api/health", 60, self.api.proc, self.api.log)
        self.admin_token = self.cli("token", "create", "--role", "admin", "--name", "tests").strip()
        if self.worker:
            self.worker.env["ULAB_WORKER_TOKEN"] = self.cli(
                "token", "create", "--role", "worker", "--name", "tests worker", "--queue", WORKER_QUEUE).strip()
            self.worker.start()
            self.wait_worker_ready()
        return self

    def cli(self, *args: str) -> str:
        """Run `ulab ARGS` against this stack's database; answers its stdout."""
        r = subprocess.run([str(ULAB), *args], env=self.env, cwd=REPO, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"ulab {' '.join(args)} failed: {r.stderr[-2000:]}")
        return r.stdout

    def client(self, role: str = "admin") -> httpx.Client:
        """An HTTP client holding a token of the given role (admin: the bootstrap token)."""
        token = self.admin_token if role == "admin" else self.token(role)
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def token(self, role: str) -> str:
        body = {"name": f"test {role}", "role": role, "queues": [WORKER_QUEUE] if role == "worker" else []}
        r = httpx.post(f"{self.url}/api/tokens", json=body,
                       headers={"Authorization": f"Bearer {self.admin_token}"}, timeout=30)
        r.raise_for_status()
        return r.json()["token"]

    def wait_worker_ready(self, timeout_s: float = 60) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if "ready." in self.worker.output():  # this start's: a restarted worker's log holds the last one's
                return
            if self.worker.proc.poll() is not None:
                raise RuntimeError(f"worker exited: {self.worker.log.read_text()[-3000:]}")
            time.sleep(0.3)
        raise TimeoutError(f"worker not ready: {self.worker.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.worker:
            self.worker.stop()
        self.api.stop()


@contextmanager
def own_stack(home: Path, worker: bool = True, **settings: str) -> Iterator[Stack]:
    """A stack of its own, for a test module that breaks it (kills its worker, empties its queue) or needs settings
    the session's `stack` does not have: a new PostgreSQL database, a Redis database, the API and (unless
    worker=False) a Celery worker, with ULAB_ `settings`. `api_client` is an admin client; all is stopped and
    dropped at the end."""
    with postgres_database() as pg, redis_database() as broker:
        s = Stack(home, pg, broker, worker=worker, **settings)
        try:
            s.start()
            with s.client() as api:
                s.api_client = api
                yield s
        finally:
            s.api_client = None
            s.stop()
