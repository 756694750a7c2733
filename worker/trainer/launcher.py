"""`ulab train` (`python -m worker.trainer`): the launcher of a run's ranks on this node.

`run_train` validates the plan and prepares (tokenizes and packs) the data before any rank starts, so a bad
plan or bad data ends with one clear line on stderr and exit code 2. Then, with more than one rank in the plan,
it starts the ranks with `torchrun_command` (the same list the worker launches), each one the rank's entry point
`python -m worker.trainer.rank` (rank.py); for a single rank it trains in this process, through the rank's
`train_rank`.

`--resume` continues from the newest complete checkpoint (step numbering, optimizer, LR schedule and data
position); without any checkpoint yet it starts from step 1, so a retry can always pass --resume.

`--resume-from stage<i>/checkpoint-<step>` ("resume from here" on the run page): the launcher first moves every newer
checkpoint to RUN_DIR/checkpoints-discarded/attempt-N, then resumes as --resume does.

`--attempt N` (the worker passes the run's attempt; a run started by hand counts on from the lock file): the
launcher takes the run directory's lock for attempt N first, stopping any process of another attempt still in it,
and the attempt writes its own metrics file (attempt.py). A stop (SIGTERM or SIGINT) is forwarded once to
torchrun, which stops the ranks; after plan.launch.launcher_stop_wait_s whatever of the attempt still runs is
SIGKILLed, and so is anything torchrun left behind when it exits.

How the attempt ended goes in RUN_DIR/outcome.json (plan/outcome.py: its cause, step, exit code and message): the
first failing rank writes it, then this launcher writes the attempt's final one, and exits with its code (the
codes are plan/outcome.py's; the reason is also the last stderr line).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from plan.launch import (
    MIN_STOP_GRACE_S,
    RANK_PREFIX,
    RANK_PREFIX_ENV,
    SHUTDOWN_TIMEOUT_ENV,
    TORCHRUN_EXIT_S,
    launcher_stop_wait_s,
    nodes_and_ranks_per_node,
    stop_grace_or_floor,
    stop_grace_s,
    torchrun_command,
    torchrun_env,
    torchrun_reads_shutdown_timeout,
)
from plan.outcome import Cause, Outcome, clear_outcome, read_outcome, write_outcome

from . import attempt as attempts
from .cpu_info import share_cpu_info
from .exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, describe_exit
from .preflight import bad_input, checked, resumable, say
from .rank import train_rank
from .spec import PlanError, RunSpec, load_plan


def build_cpu_adam() -> None:
    """DeepSpeedCPUAdam is a C++ extension that DeepSpeed builds on first use (g++ and ninja, about a minute on 2
    cores) and caches in torch's extensions directory. Build it here, once, before the ranks start, instead of
    every rank of the node waiting on one build lock at its first optimizer step. A GPU image ships it prebuilt
    (DS_BUILD_CPU_ADAM=1, Dockerfile), and then this only loads it."""
    from deepspeed.ops.op_builder import CPUAdamBuilder

    CPUAdamBuilder().load(verbose=False)


def run_dry(plan_path: Path) -> int:
    """`ulab train --dry-run`: the validated plan and the settings it turns into on this machine, as JSON."""
    import json

    import torch

    from plan.launch import dry_run

    try:
        spec = RunSpec.from_plan(load_plan(plan_path))
        spec.check_attention(cuda=torch.cuda.is_available())  # the rest of check_device: at the run's start
    except PlanError as e:
        say(f"error: {e}")
        return EXIT_BAD_INPUT
    from worker.trainer.capabilities import capabilities

    print(json.dumps(dry_run(spec.spec, cuda=torch.cuda.is_available(),
                             installed=capabilities()["attn_implementations"]), indent=1))
    return EXIT_OK


def _plan_stop_grace_s(plan_path: Path) -> float:
    try:
        return stop_grace_or_floor(json.loads(Path(plan_path).read_text()))
    except (OSError, ValueError):  # the plan is unreadable: validate() says so in a moment
        return MIN_STOP_GRACE_S


def hold_run_dir(plan_path: Path, run_dir: Path, attempt: int | None) -> attempts.RunLock:
    """Tag this process (and so torchrun and the ranks) with the run's lock and attempt, and take the lock, stopping
    what another attempt left in the run directory (the ranks join it: rank.join_run_dir). Raises attempt.LockBusy."""
    node_rank = int(os.environ.get("ULAB_NODE_RANK", "0"))
    path = os.environ.get(attempts.RUN_LOCK_ENV) or str(attempts.lock_file(run_dir, node_rank))
    number = attempt or int(os.environ.get(attempts.ATTEMPT_ENV, "0")) or attempts.previous_attempt(run_dir,
                                                                                                     node_rank) + 1
    os.environ.update(attempts.attempt_tag(path, number))
    lock = attempts.RunLock(path)
    lock.take(number, _plan_stop_grace_s(plan_path), say=lambda line: print(line, flush=True))
    return lock


def run_train(plan_path: Path, run_dir: Path, resume: bool, attempt: int | None = None,
              resume_from: str | None = None) -> int:
    plan_path, run_dir = Path(plan_path), Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = hold_run_dir(plan_path, run_dir, attempt)
    except (attempts.LockBusy, OSError) as e:
        say(f"error: {e}")
        return EXIT_FAILED
    clear_outcome(run_dir)  # with the lock: an earlier attempt's record goes
    if resume_from:  # with the lock: no rank is saving now
        from .checkpoints import discard_newer

        try:
            moved = discard_newer(run_dir, resume_from, lock.attempt or 0)
        except (ValueError, OSError) as e:
            return bad_input(run_dir, f"error: {e}")
        print(f"--resume-from {resume_from}: {len(moved)} newer checkpoint(s) moved aside"
              + (f" ({', '.join(str(p) for p in moved)})" if moved else ""), flush=True)
        resume = True
    spec = checked(plan_path, run_dir, resume)
    if isinstance(spec, int):
        return spec
    resume = resumable(run_dir, resume, announce=True)
    if spec.offload_optimizer:
        share_cpu_info()  # DeepSpeed's CPU Adam asks which CPU this is 3 times per rank, a subprocess each
        build_cpu_adam()
    if spec.world_size > 1:
        return _launch_ranks(spec, plan_path, run_dir, resume, lock)
    code = train_rank(spec, run_dir, resume)
    if code == EXIT_OK:  # one process, no torchrun: the launcher's record
        write_outcome(run_dir, Outcome.of(Cause.COMPLETED, attempt=lock.attempt))
    return code


def _launch_ranks(spec: RunSpec, plan_path: Path, run_dir: Path, resume: bool, lock: attempts.RunLock) -> int:
    nnodes, per_node = nodes_and_ranks_per_node(spec.spec)
    endpoint = os.environ.get("ULAB_RDZV_ENDPOINT")
    if nnodes > 1 and not endpoint:
        say(f"error: hardware.num_nodes={nnodes}: set ULAB_RDZV_ENDPOINT=host:port (and ULAB_NODE_RANK) on every node")
        return EXIT_BAD_INPUT
    cmd = torchrun_command(plan_path, run_dir, resume=resume, nproc_per_node=per_node, nnodes=nnodes,
                           node_rank=int(os.environ.get("ULAB_NODE_RANK", "0")), rdzv_endpoint=endpoint,
                           rdzv_id=os.environ.get("ULAB_RDZV_ID"),
                           rank_logs=run_dir / "logs" / f"attempt-{lock.attempt}")
    rc = _run_torchrun(cmd, spec, lock)
    # the attempt's record: completed; else the first failing rank's; else torchrun's own end (killed, say)
    final = Outcome.of(Cause.COMPLETED) if rc == 0 else read_outcome(run_dir) or Outcome.of(
        Cause.SIGNAL if rc < 0 else Cause.ERROR, f"torchrun was {describe_exit(rc)}", exit_code=EXIT_FAILED)
    final = Outcome(final.cause, final.exit_code, final.message, final.step, final.rank, lock.attempt)
    write_outcome(run_dir, final)
    if rc != 0:
        say(final.message)
    return final.exit_code


def _run_torchrun(cmd: list[str], spec: RunSpec, lock: attempts.RunLock) -> int:
    """Run torchrun to its end and answer its return code. It gets a session of its own, so only this process
    signals it: a stop is forwarded exactly once (a second SIGTERM makes torchrun quit before its ranks have
    saved). It shares this process's lock and gets SIGTERM if this process dies. Whatever of the attempt is
    left when torchrun exits, or when it overruns the stop deadline, is SIGKILLed here."""
    grace = stop_grace_s(spec.spec)
    if grace > MIN_STOP_GRACE_S and torchrun_reads_shutdown_timeout() is False:
        say(f"warning: this torch's torchrun does not read {SHUTDOWN_TIMEOUT_ENV}: after a stop the ranks get its "
             f"fixed {MIN_STOP_GRACE_S:.0f} s to save, not run.stop_grace_s={grace:.0f} s")
    env = {**os.environ, RANK_PREFIX_ENV: os.environ.get(RANK_PREFIX_ENV, RANK_PREFIX), **torchrun_env(grace)}
    proc = subprocess.Popen(cmd, start_new_session=True, pass_fds=(lock.inheritable_fd(),),
                            preexec_fn=attempts.die_with_parent, env=env)
    deadline: list[float] = []

    def forward(signum, _frame):
        if not deadline:
            deadline.append(time.monotonic() + launcher_stop_wait_s(spec.spec))
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while proc.poll() is None and not (deadline and time.monotonic() > deadline[0]):
            try:
                proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
        mine = attempts.tagged(lock.path, attempt=lock.attempt)
        if proc.poll() is None:
            say(f"torchrun did not stop within {launcher_stop_wait_s(spec.spec):.0f} s of the stop; killing "
                 f"pids {attempts.describe(mine)}")
            left = attempts.kill_left(mine, 0)
        else:  # ranks torchrun left behind (it was killed, say): they get what torchrun itself gives its own
            left = attempts.stop_processes(mine, TORCHRUN_EXIT_S)
        if left:
            say(f"processes {attempts.describe(left)} of this run survived SIGKILL")
        return proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m worker.trainer",
                                description="Ulysses SP trainer: starts the ranks of a run on this node")
    p.add_argument("--plan", required=True, type=Path)
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--attempt", type=int, default=None, help="the run's attempt number (the worker passes it)")
    p.add_argument("--resume-from", default=None, metavar="stage<i>/checkpoint-<step>",
                   help="resume from this checkpoint under RUN_DIR/checkpoints; the newer ones are moved to "
                        "RUN_DIR/checkpoints-discarded/attempt-N first (implies --resume)")
    a = p.parse_args(argv)
    return run_train(a.plan, a.run_dir, a.resume, a.attempt, a.resume_from)
