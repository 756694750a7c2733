"""The `ulab` command: serve, worker, plan, train, probe, migrate. Imports are lazy so `ulab plan` starts fast."""
from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Ulysses Lab: plan, queue and watch Ulysses SP training.")


@app.command()
def plan(
    json_path: Path | None = typer.Option(None, "--json", exists=True, dir_okay=False, help="Plan file (plan-v1; a "
                                          "`run` section is allowed)."),
    max_seq: bool = typer.Option(False, "--max-seq", help="Answer the longest seq_len that fits."),
    effective: bool = typer.Option(False, "--effective", help="Print the validated plan with every default filled."),
    text: bool = typer.Option(False, "--text", help="Print a summary for people instead of the JSON."),
    recommend: bool = typer.Option(False, "--recommend", help="Answer the configurations that fit the file's model, "
                                   "hardware and seq_len, best first (other training/parallel fields it sets are "
                                   "locked)."),
    longest: bool = typer.Option(False, "--longest", help="With --recommend: search for the longest seq_len."),
    vary_batch: bool = typer.Option(False, "--vary-batch", help="With --recommend: let the global batch follow dp "
                                    "(by default every option trains the plan's sequences per step, grad_accum "
                                    "adjusted)."),
    fix: bool = typer.Option(False, "--fix", help="Answer the fewest, cheapest changes that make the plan fit."),
    from_workers: bool = typer.Option(False, "--from-workers", help="With --recommend/--fix: put first the options "
                                      "whose attention kernel (and Liger) the live workers of the plan's queue report "
                                      "(reads ULAB_DATABASE_URL, as the API's recommend and fix do)."),
    sp_methods: bool = typer.Option(False, "--sp-methods", help="Estimate Ulysses vs ring attention vs a hybrid."),
    import_path: Path | None = typer.Option(None, "--import", exists=True, dir_okay=False, help="Import a DeepSpeed "
                                            "config (ds_config.json) instead of a plan file: prints the plan, "
                                            "warnings, errors, defaults and estimate."),
    launch: str | None = typer.Option(None, "--launch", help='With --import: the launch line ("deepspeed ...", '
                                      '"torchrun ...", "accelerate launch ...").'),
    accelerate_config: Path | None = typer.Option(None, "--accelerate-config", exists=True, dir_okay=False,
                                                  help="With --import: an Accelerate config YAML."),
    training_args: Path | None = typer.Option(None, "--training-args", exists=True, dir_okay=False,
                                              help="With --import: TrainingArguments as JSON."),
    gpu: str | None = typer.Option(None, "--gpu", help="With --import: the GPU the job runs on (H100-80GB)."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", min=1, help="With --import: GPUs per node (8)."),
    train_tokens: float | None = typer.Option(None, "--train-tokens", help="Tokens to train on (2e9 is fine): the "
                                              "estimate answers `cost`, the run's wall time and GPU-hours; with "
                                              "--recommend, rank by that wall time."),
) -> None:
    """Estimate per-GPU memory and throughput for a plan (prints plan-v1 estimate JSON). Exit 1 if the plan is
    not valid, with every broken field named. With --import, the plan a DeepSpeed setup describes (exit 1 if the
    setup has errors)."""
    import plan as planner
    from plan.report import recommend_report, text_report

    if import_path is not None:
        _import(import_path, launch, accelerate_config, training_args, gpu, gpus_per_node)
    if json_path is None:
        typer.echo("give --json PLAN or --import DS_CONFIG", err=True)
        raise typer.Exit(2)
    try:
        data = json.loads(json_path.read_text())
    except json.JSONDecodeError as e:
        typer.echo(f"{json_path}: not valid JSON: {e}", err=True)
        raise typer.Exit(2) from None
    if effective:
        v = planner.validate(data)
        if v.plan is None or v.errors:
            typer.echo(json.dumps({"valid": False, "errors": v.errors, "warnings": v.warnings}, indent=1))
            raise typer.Exit(1)
        typer.echo(json.dumps(v.plan.effective(), indent=1))
        raise typer.Exit(0)
    budget = _train_tokens(train_tokens)
    if recommend or fix or sp_methods:
        kernels, liger = _queue_offer(data) if from_workers else (None, True)
        if recommend:
            answer = planner.recommend(data, longest=longest, kernels=kernels, liger=liger, train_tokens=budget,
                                       vary_batch=vary_batch)
            ok = not answer.get("errors")
        elif fix:
            answer = planner.fix(data, kernels=kernels, liger=liger)
            ok = answer["estimate"].get("valid", False)
        else:
            answer = planner.compare_sp_methods(data)
            ok = answer["valid"]
        typer.echo(recommend_report(answer) if recommend and text else json.dumps(answer, indent=1))
        raise typer.Exit(0 if ok else 1)
    result = planner.max_seq_len(data) if max_seq else planner.estimate(data, budget)
    est = result["estimate"] if max_seq else result
    if text:
        typer.echo(text_report(data, est, result["max_seq_len"] if max_seq else None,
                               result.get("likely") if max_seq else None))
    else:
        typer.echo(json.dumps(result, indent=1))
    raise typer.Exit(0 if est.get("valid") else 1)


def _train_tokens(value: float | None) -> int | None:
    """--train-tokens as a whole number of tokens, checked as the API checks it (plan.cost.TrainTokens)."""
    if value is None:
        return None
    from pydantic import TypeAdapter, ValidationError

    from plan.cost import TrainTokens

    try:
        return TypeAdapter(TrainTokens).validate_python(round(value))
    except ValidationError as e:
        typer.echo(f"--train-tokens: {e.errors()[0]['msg']}", err=True)
        raise typer.Exit(2) from None


def _queue_offer(data: dict) -> tuple[list[str] | None, bool]:
    """What the plan's queue can run (backend/workers/service.queue_offer), from this installation's database."""
    from backend.core.db import session_scope
    from backend.core.queue import gpu_name
    from backend.workers import service

    with session_scope() as s:
        return service.queue_offer(s, gpu_name(data) if isinstance(data, dict) else "")


def _import(ds_path: Path, launch: str | None, accelerate_path: Path | None, args_path: Path | None,
            gpu: str | None, gpus_per_node: int | None) -> None:
    from plan import importer

    try:
        answer = importer.import_setup(
            importer.parse_json(ds_path.read_text(), str(ds_path)), launch,
            importer.parse_yaml(accelerate_path.read_text(), str(accelerate_path)) if accelerate_path else None,
            importer.parse_json(args_path.read_text(), str(args_path)) if args_path else None,
            gpu=gpu, gpus_per_node=gpus_per_node)
    except importer.InputError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps(answer, indent=1))
    raise typer.Exit(1 if answer["errors"] else 0)


@app.command()
def train(
    plan_path: Path = typer.Option(..., "--plan", help="Plan file with a `run` section (trainer-v1)."),
    run_dir: Path = typer.Option(..., "--run-dir", help="Directory for metrics.jsonl, logs and checkpoints."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in run-dir."),
    resume_from: str | None = typer.Option(None, "--resume-from", metavar="stage<i>/checkpoint-<step>",
                                           help="Continue from this checkpoint; newer ones are moved to "
                                                "run-dir/checkpoints-discarded/attempt-N first."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the DeepSpeed, Accelerate and "
                                 "TrainingArguments settings it turns into on this machine; start nothing."),
) -> None:
    """Run the Ulysses trainer (starts its own ranks with torchrun when the plan has more than one)."""
    from worker.trainer.launcher import run_dry, run_train

    raise typer.Exit(run_dry(plan_path) if dry_run else run_train(plan_path, run_dir, resume,
                                                                  resume_from=resume_from))


@app.command()
def probe(
    plan_path: Path = typer.Option(..., "--plan", help="Plan file (plan-v1; a `run` section is allowed)."),
    depths: str = typer.Option("1,2,4", "--depths", help="Layer counts to probe, comma-separated."),
    steps: int = typer.Option(4, "--steps", min=2, max=1000, help="Steps per depth (the first is dropped)."),
    full: bool = typer.Option(False, "--full", help="Also run the model's full depth."),
    text: bool = typer.Option(False, "--text", help="Print the measured and extrapolated table instead of JSON."),
    out: Path | None = typer.Option(None, "--out", help="Directory for the probe's runs (default: a temporary one)."),
) -> None:
    """Measure the plan: short runs at reduced depth with random weights on this machine (torchrun, as `ulab
    train`), fitted per quantity over depth and extrapolated to the model's depth, beside the planner's figures."""
    import tempfile

    from worker.probe import parse_depths, run_probe_cli

    if out is None:
        with tempfile.TemporaryDirectory(prefix="ulab-probe-") as tmp:
            raise typer.Exit(run_probe_cli(plan_path, Path(tmp), parse_depths(depths), steps, full, text))
    raise typer.Exit(run_probe_cli(plan_path, out, parse_depths(depths), steps, full, text))


@app.command()
def job(plan_path: Path = typer.Option(..., "--plan", help="The run's plan file in its run directory.")) -> None:
    """One node of a run's Slurm job (srun starts it from the job script): trains, ships metrics, beats."""
    from worker.slurm_job import run_job

    raise typer.Exit(run_job(plan_path))


@app.command()
def openapi(out: Path | None = typer.Option(None, "--out", help="Write the schema here instead of stdout.")) -> None:
    """Print the HTTP API's OpenAPI schema (the dashboard generates its TypeScript types from it)."""
    from backend.main import create_app

    text = json.dumps(create_app().openapi(), indent=1, sort_keys=True) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    elif not out.is_file() or out.read_text() != text:  # unchanged: keep the file's time, so make does nothing
        out.write_text(text)


@app.command()
def migrate() -> None:
    """Bring the database schema up to date (Alembic upgrade head)."""
    from backend.core.db import upgrade_database

    upgrade_database()
    typer.echo("database is up to date")


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8000),
    migrate_first: bool = typer.Option(True, "--migrate/--no-migrate", help="Run migrations before serving."),
    workers: int = typer.Option(1, "--workers", min=1, max=64, help="API processes (uvicorn workers)."),
) -> None:
    """Start the API and dashboard."""
    import os
    import shutil

    import uvicorn

    if migrate_first:
        from backend.core.db import upgrade_database

        upgrade_database()
    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # several processes: each writes its counters to files there and GET /metrics sums them (prometheus-client)
        from backend.core.settings import get_settings

        shared = get_settings().home / "prometheus"
        shutil.rmtree(shared, ignore_errors=True)  # the counters of a previous server are not this one's
        shared.mkdir(parents=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(shared)
    uvicorn.run("backend.main:app", host=host, port=port, log_level="info", workers=workers)


@app.command()
def worker(
    gpu_type: str | None = typer.Option(None, "--gpu-type", help="GPU type this node serves (its queue)."),
    gpus: int = typer.Option(0, "--gpus", help="GPUs on this node (0: as many as the run asks, CPU ranks)."),
    loglevel: str = typer.Option("info"),
) -> None:
    """Start a Celery worker that executes approved runs, one at a time."""
    from worker.celery_app import start_worker

    start_worker(gpu_type=gpu_type, gpus=gpus, loglevel=loglevel)


token_app = typer.Typer(help="API tokens (the first admin token is created here).", no_args_is_help=True)
app.add_typer(token_app, name="token")


@token_app.command("create")
def token_create(
    role: str = typer.Option(..., "--role", help="viewer, submitter, approver, admin or worker."),
    name: str = typer.Option("cli", "--name", help="Who or what holds the token."),
    file: Path | None = typer.Option(None, "--file", help="Also write the token to this file (mode 600)."),
    reuse: bool = typer.Option(False, "--reuse", help="If --file holds a valid token already, print it instead."),
    queue: list[str] = typer.Option([], "--queue", help="A worker token's queue (repeat for more), e.g. "
                                    "gpu-h100-80gb: it claims runs of these queues only."),
    all_queues: bool = typer.Option(False, "--all-queues", help="A worker token for every catalog GPU's queue "
                                    "(what `ulab worker` without --gpu-type consumes)."),
) -> None:
    """Create an API token and print it (only its hash is stored)."""
    from backend.auth.roles import Role
    from backend.auth.service import create_token, token_in_file
    from backend.core.db import get_sessionmaker, upgrade_database

    try:
        role_enum = Role(role)
    except ValueError:
        typer.echo(f"--role must be one of {', '.join(r.value for r in Role)}", err=True)
        raise typer.Exit(2) from None
    if all_queues:
        from backend.core.queue import queue_for
        from plan import catalog

        queue = [*queue, *(queue_for(gpu) for gpu in catalog.gpus())]
    upgrade_database()
    with get_sessionmaker()() as session:
        try:
            if reuse and file:
                typer.echo(token_in_file(session, file, name, role_enum, queue)[0])
                return
            _, token = create_token(session, name, role_enum, queue)
        except ValueError as e:
            typer.echo(f"--queue: {e}", err=True)
            raise typer.Exit(2) from None
    if file:
        file.parent.mkdir(parents=True, exist_ok=True)
        file.touch(mode=0o600)
        file.write_text(token + "\n")
    typer.echo(token)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
