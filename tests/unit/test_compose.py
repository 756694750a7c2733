"""docker-compose.yml is checked against the code: every ULAB_ variable is a setting, every command exists."""
from pathlib import Path

import click
import typer
import yaml

from backend.cli import app
from backend.core.settings import Settings
from worker.celery_app import queue_for

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
ULAB = typer.main.get_command(app)


def ulab_command(argv: list[str]) -> click.Command:
    assert argv[0] == "ulab", argv
    cmd = ULAB.commands.get(argv[1])
    assert cmd is not None, f"`ulab {argv[1]}` does not exist"
    options = {o for p in cmd.params for o in p.opts + p.secondary_opts}
    for arg in argv[2:]:
        if arg.startswith("--"):
            assert arg.split("=")[0] in options, f"`ulab {argv[1]}` has no option {arg}"
    cmd.make_context(argv[1], argv[2:])  # parses: values must have the right types
    return cmd


def test_services_are_the_design_set():
    assert set(SERVICES) == {"api", "worker", "redis", "postgres", "flower"}


def test_ulab_variables_are_settings_and_parse():
    fields = {f"ULAB_{name.upper()}" for name in Settings.model_fields}
    for name in ("api", "worker"):
        env = SERVICES[name]["environment"]
        ulab_vars = {k: v for k, v in env.items() if k.startswith("ULAB_")}
        assert {"ULAB_DATABASE_URL", "ULAB_BROKER_URL"} <= set(ulab_vars), name
        assert set(ulab_vars) <= fields, f"{name}: unknown settings {set(ulab_vars) - fields}"
        settings = Settings(**{k.removeprefix("ULAB_").lower(): v for k, v in ulab_vars.items()})
        assert settings.resolved_database_url.startswith("postgresql+psycopg://")
        host = settings.resolved_database_url.split("@")[1].split(":")[0]
        assert host in SERVICES, f"database host {host} is not a service"
        assert settings.resolved_broker_url.startswith("redis://redis:")


def test_commands_exist_with_their_options():
    ulab_command(SERVICES["api"]["command"])
    worker = SERVICES["worker"]["command"]
    ulab_command(worker)
    gpu = worker[worker.index("--gpu-type") + 1]
    assert SERVICES["worker"]["environment"]["ULAB_GPU_TYPE"] == gpu
    assert queue_for(gpu) == "gpu-h100-80gb"
    flower_broker = [a for a in SERVICES["flower"]["command"] if a.startswith("--broker=")][0]
    assert flower_broker.split("=", 1)[1] == SERVICES["worker"]["environment"]["ULAB_BROKER_URL"]


def test_worker_reserves_gpus_and_shared_memory():
    w = SERVICES["worker"]
    devices = w["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"] and w["shm_size"]
    assert any(k.startswith("NCCL_") for k in w["environment"])


def test_images_are_built_from_the_repo_dockerfile():
    dockerfile = (REPO / "Dockerfile").read_text()
    for name in ("api", "worker"):
        target = SERVICES[name]["build"]["target"]
        assert f"AS {target}" in dockerfile
    assert "npm ci" in dockerfile and "pip install" in dockerfile
