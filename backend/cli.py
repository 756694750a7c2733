"""The `ulab` command: serve, worker, plan, train, migrate. Imports are lazy so `ulab plan` starts fast."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Ulysses Lab: plan, queue and watch Ulysses SP training.")


@app.command()
def plan(
    json_path: Path = typer.Option(..., "--json", exists=True, dir_okay=False, help="Plan file (plan-v1)."),
    max_seq: bool = typer.Option(False, "--max-seq", help="Answer the longest seq_len that fits."),
    text: bool = typer.Option(False, "--text", help="Print a summary for people instead of the JSON."),
) -> None:
    """Estimate per-GPU memory and throughput for a plan (prints plan-v1 estimate JSON). Exit 1 if the plan is
    not valid."""
    from backend import planner
    from backend.planner.report import text_report

    try:
        spec = json.loads(json_path.read_text())
    except json.JSONDecodeError as e:
        typer.echo(f"{json_path}: not valid JSON: {e}", err=True)
        raise typer.Exit(2)
    result = planner.max_seq_len(spec) if max_seq else planner.estimate(spec)
    est = result["estimate"] if max_seq else result
    if text:
        typer.echo(text_report(spec, est, result["max_seq_len"] if max_seq else None))
    else:
        typer.echo(json.dumps(result, indent=1))
    raise typer.Exit(0 if est.get("valid") else 1)


@app.command()
def train(
    plan_path: Path = typer.Option(..., "--plan", help="Plan file with a `run` section (trainer-v1)."),
    run_dir: Path = typer.Option(..., "--run-dir", help="Directory for metrics.jsonl, logs and checkpoints."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in run-dir."),
) -> None:
    """Run the Ulysses trainer (starts its own ranks with torchrun when the plan has more than one)."""
    from worker.trainer.cli import run_train

    raise typer.Exit(run_train(plan_path, run_dir, resume))


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
    import uvicorn

    if migrate_first:
        from backend.core.db import upgrade_database

        upgrade_database()
    uvicorn.run("backend.main:app", host=host, port=port, log_level="info", workers=workers)


@app.command()
def worker(
    gpu_type: Optional[str] = typer.Option(None, "--gpu-type", help="GPU type this node serves (its queue)."),
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
    file: Optional[Path] = typer.Option(None, "--file", help="Also write the token to this file (mode 600)."),
    reuse: bool = typer.Option(False, "--reuse", help="If --file holds a valid token already, print it instead."),
) -> None:
    """Create an API token and print it (only its hash is stored)."""
    from backend.auth.roles import Role
    from backend.auth.service import create_token, verify
    from backend.core.db import get_sessionmaker, upgrade_database

    try:
        role_enum = Role(role)
    except ValueError:
        typer.echo(f"--role must be one of {', '.join(r.value for r in Role)}", err=True)
        raise typer.Exit(2)
    upgrade_database()
    with get_sessionmaker()() as session:
        if reuse and file and file.is_file():
            old = file.read_text().strip()
            if verify(session, old):
                typer.echo(old)
                return
        _, token = create_token(session, name, role_enum)
    if file:
        file.parent.mkdir(parents=True, exist_ok=True)
        file.touch(mode=0o600)
        file.write_text(token + "\n")
    typer.echo(token)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
