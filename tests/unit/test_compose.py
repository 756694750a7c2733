"""docker-compose.yml is checked against the code: every ULAB_ variable is a setting, every command exists."""
import re
import tomllib
from pathlib import Path

import click
import typer
import yaml

from backend.cli import app
from backend.core.queue import queue_for
from backend.core.settings import Settings

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
ULAB = typer.main.get_command(app)


def ulab_command(argv: list[str]) -> click.Command:
    assert argv[0] == "ulab", argv
    cmd, args = ULAB.commands.get(argv[1]), argv[2:]
    while hasattr(cmd, "commands"):  # a group: `ulab token create ...`
        cmd, args = cmd.commands.get(args[0]), args[1:]
    assert cmd is not None, f"`{' '.join(argv[:2])}` does not exist"
    options = {o for p in cmd.params for o in p.opts + p.secondary_opts}
    for arg in args:
        if arg.startswith("--"):
            assert arg.split("=")[0] in options, f"`ulab {argv[1]}` has no option {arg}"
    cmd.make_context(argv[1], args)  # parses: values must have the right types
    return cmd


def test_services_are_the_design_set():
    assert set(SERVICES) == {"api", "worker", "redis", "postgres", "flower", "prometheus", "prometheus-token",
                             "worker-token"}


def test_prometheus_scrapes_the_api_with_the_token_its_service_writes():
    config = yaml.safe_load((REPO / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["api:8000"]
    token = SERVICES["prometheus-token"]["command"]
    ulab_command(token)
    assert token[token.index("--role") + 1] == "viewer"  # a read: the least that may scrape
    written = token[token.index("--file") + 1]
    assert job["authorization"]["credentials_file"] == written
    mounts = {m.split(":")[0]: m.split(":")[1] for m in SERVICES["prometheus"]["volumes"]}
    assert mounts["./prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert any(written.startswith(mounts[v] + "/") for v in mounts if v == "tokens")
    assert "tokens:/tokens" in SERVICES["prometheus-token"]["volumes"]


def defaults(value: str) -> str:
    """A compose value with `${VAR:-default}` resolved to its default (what runs when VAR is unset), and a required
    `${VAR:?message}` to `<VAR>` (compose refuses to start without it)."""
    value = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))
    return re.sub(r"\$\{([A-Z_]+):\?[^}]*\}", r"<\1>", value)


def published(service: str, port: int) -> bool:
    return any(defaults(p).endswith(f":{port}:{port}") for p in SERVICES[service].get("ports", []))


def test_ulab_variables_are_settings_and_parse():
    fields = {f"ULAB_{name.upper()}" for name in Settings.model_fields}
    for name in ("api", "worker"):
        env = SERVICES[name]["environment"]
        ulab_vars = {k: defaults(v) for k, v in env.items() if k.startswith("ULAB_")}
        assert {"ULAB_BROKER_URL", "ULAB_REDIS_PASSWORD"} <= set(ulab_vars), name
        assert set(ulab_vars) <= fields, f"{name}: unknown settings {set(ulab_vars) - fields}"
        settings = Settings(**{k.removeprefix("ULAB_").lower(): v for k, v in ulab_vars.items()})
        if SERVICES[name].get("network_mode") == "host":  # reaches the services through their published ports
            assert "ULAB_DATABASE_URL" not in ulab_vars, f"{name}: a worker speaks HTTP only"
            assert published("redis", 6379), name
            assert settings.resolved_broker_url == "redis://:%3CULAB_REDIS_PASSWORD%3E@127.0.0.1:6379/0"
        else:
            assert settings.resolved_database_url.startswith("postgresql+psycopg://ulab:<ULAB_DB_PASSWORD>@")
            host = settings.resolved_database_url.split("@")[1].split(":")[0]
            assert host in SERVICES, f"database host {host} is not a service"
            assert settings.resolved_broker_url == "redis://:%3CULAB_REDIS_PASSWORD%3E@redis:6379/0"


def test_redis_requires_the_password_the_settings_read():
    redis = SERVICES["redis"]
    command = [defaults(a) for a in redis["command"]]
    assert command[command.index("--requirepass") + 1] == "<ULAB_REDIS_PASSWORD>"
    assert defaults(redis["environment"]["REDISCLI_AUTH"]) == "<ULAB_REDIS_PASSWORD>"  # its health check's
    for name in ("api", "worker", "worker-token", "prometheus-token"):
        assert defaults(SERVICES[name]["environment"]["ULAB_REDIS_PASSWORD"]) == "<ULAB_REDIS_PASSWORD>", name


def test_the_service_uses_its_own_database_role_not_the_superuser():
    pg = SERVICES["postgres"]["environment"]
    assert pg["POSTGRES_USER"] != pg["ULAB_DB_USER"] == "ulab"
    assert "./scripts/postgres-init.sh:/docker-entrypoint-initdb.d/ulab.sh:ro" in SERVICES["postgres"]["volumes"]
    url = defaults(SERVICES["api"]["environment"]["ULAB_DATABASE_URL"])
    assert url.startswith(f"postgresql+psycopg://{pg['ULAB_DB_USER']}:<ULAB_DB_PASSWORD>@postgres:5432/"
                          f"{pg['ULAB_DB_NAME']}")
    assert defaults(pg["ULAB_DB_PASSWORD"]) == "<ULAB_DB_PASSWORD>"
    assert defaults(pg["POSTGRES_PASSWORD"]) == "<POSTGRES_SUPERUSER_PASSWORD>"


def test_the_worker_gets_a_worker_token_of_its_queue_and_no_database_url():
    w, token = SERVICES["worker"], SERVICES["worker-token"]["command"]
    ulab_command(token)
    assert token[token.index("--role") + 1] == "worker"
    assert token[token.index("--queue") + 1] == queue_for(w["environment"]["ULAB_GPU_TYPE"])
    written = token[token.index("--file") + 1]
    home = w["environment"]["ULAB_HOME"]
    assert written == f"{home}/worker-token"  # where the worker reads it (backend/runs/agent.worker_token)
    assert f"workertoken:{home}" in w["volumes"]
    assert "ULAB_DATABASE_URL" not in w["environment"]


def test_worker_has_the_hosts_network_and_nccl_settings():
    w = SERVICES["worker"]
    assert w["network_mode"] == "host"
    assert "ports" not in w
    env = {k: defaults(v) for k, v in w["environment"].items()}
    assert env["NCCL_SOCKET_IFNAME"] == "^lo,docker"
    assert "NCCL_IB_HCA" in env
    assert "IPC_LOCK" in w["cap_add"]
    assert {"ULAB_NODE_ADDRESS", "ULAB_NODE_INTERFACE"} <= set(env)
    # one run directory for the API and the worker (and, multi-node, every node: RUNS_DIR on a shared mount)
    assert SERVICES["api"]["volumes"] == w["volumes"][:1] == ["${RUNS_DIR:-runs}:/runs"]


def test_commands_exist_with_their_options():
    ulab_command(SERVICES["api"]["command"])
    worker = SERVICES["worker"]["command"]
    ulab_command(worker)
    gpu = worker[worker.index("--gpu-type") + 1]
    assert SERVICES["worker"]["environment"]["ULAB_GPU_TYPE"] == gpu
    assert queue_for(gpu) == "gpu-h100-80gb"
    flower_broker = defaults([a for a in SERVICES["flower"]["command"] if a.startswith("--broker=")][0])
    api = Settings(broker_url=SERVICES["api"]["environment"]["ULAB_BROKER_URL"],
                   redis_password=defaults(SERVICES["api"]["environment"]["ULAB_REDIS_PASSWORD"]))
    assert flower_broker.split("=", 1)[1].replace("<ULAB_REDIS_PASSWORD>", "%3CULAB_REDIS_PASSWORD%3E") == \
        api.resolved_broker_url
    worker_broker = defaults(SERVICES["worker"]["environment"]["ULAB_BROKER_URL"])
    assert worker_broker.rsplit(":", 1)[1] == flower_broker.rsplit(":", 1)[1]  # the same port and database


def test_worker_reserves_gpus_and_shared_memory():
    w = SERVICES["worker"]
    devices = w["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert w["shm_size"]
    assert any(k.startswith("NCCL_") for k in w["environment"])


def test_images_are_built_from_the_repo_dockerfile():
    dockerfile = (REPO / "Dockerfile").read_text()
    for name in ("api", "worker"):
        target = SERVICES[name]["build"]["target"]
        assert f"AS {target}" in dockerfile
    assert "npm ci" in dockerfile
    assert "pip install" in dockerfile


def test_dockerfile_copies_every_package_and_generates_the_api_types_first():
    # a package missing from the image imports fine here (the checkout has it) and fails only in the container
    dockerfile = (REPO / "Dockerfile").read_text()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    for package in packages:
        assert f"COPY {package}/ {package}/" in dockerfile, package
    # the Node stage builds against the schema the Python stage wrote
    assert dockerfile.index("ulab openapi --out") < dockerfile.index("npm run build")
    assert "openapi.json" in dockerfile.split("FROM node")[1]
    # the planner bundles examples/tiny-llama-sp2.json: the Node stage has it beside frontend/ before it builds
    assert "COPY examples/ ../examples/" in dockerfile.split("FROM node")[1].split("npm run build")[0]


def test_the_redis_password_goes_into_a_broker_url_that_names_none():
    assert Settings(broker_url="redis://h:6379/0", redis_password="p@ss/w:rd").resolved_broker_url == \
        "redis://:p%40ss%2Fw%3Ard@h:6379/0"
    assert Settings(broker_url="redis://:given@h:6379/0", redis_password="other").resolved_broker_url == \
        "redis://:given@h:6379/0"  # a URL with its own password keeps it
    assert Settings(broker_url="redis://h:6379/0").resolved_broker_url == "redis://h:6379/0"
