"""`ulab probe`: train the plan at reduced depths on this machine and extrapolate to the model's depth.

Each depth is a probe plan (plan/probe.py: random weights, the plan's layout, a few steps) in OUT/depth-N, checked
and its data packed as `ulab train` does. All depths then train in ONE launch under torchrun (as any run), the ranks
building and training each depth's model in turn (worker/trainer/probe_ranks.py): the process start, the process
group and the imports are paid once, not per depth. Each depth's metrics file gives, per rank, the peak allocated
and reserved memory (CPU ranks: the trainer's live-tensor count) and the nvidia-smi total, and per step the step
time (with its forward, backward and optimizer parts where the trainer records them), tokens/s and loss; the first
step is dropped. An out-of-memory depth is a result ("does not fit even at 2 layers"): the deeper ones are then
skipped. A depth that fails otherwise ends the launch; the depths after it get a launch of their own. OUT/probe.json
holds the result (plan.probe.summarize); OUT/launch.log the ranks' output.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from plan.outcome import OUTCOME_FILE, Cause, describe_exit, read_outcome
from plan.probe import DEPTHS, PARTS, STEPS, ProbeError, full_depth, probe_plan, summarize, text_table
from worker.trainer.probe_layout import DONE, depth_dir

RESULT = "probe.json"
REQUEST = "probe_request.json"  # beside a Slurm job's plan.json: the job runs a probe (worker/slurm_job.py)
# the same filler on every rank and depth: the byte tokenizer turns it into ids below 256 (any vocab holds them)
WORDS = "ulysses splits the sequence across ranks and trades tokens for attention heads in one all to all".split()


def write_data(path: Path, seq_len: int) -> Path:
    """Documents enough for two packed rows (the trainer's rows cycle, so a probe needs no more)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    need, i = 2 * seq_len + 2, 0
    docs: list[str] = []
    while sum(len(d) + 2 for d in docs) < need:
        docs.append(" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(40)) + ".")
        i += 1
    path.write_text("\n\n".join(docs) + "\n")
    return path


def read_depth(run_dir: Path, world: int) -> dict:
    """Per rank peaks and the step figures of one depth's metrics, the first step dropped."""
    from worker.trainer.attempt import read_metrics

    records = [r for r in read_metrics(run_dir) if "peak_allocated_gib" in r]
    kept = records[1:] or records
    ranks = []
    for r in range(world):
        def peak(name: str, r=r) -> float | None:
            vals = [rec[name][r] for rec in kept if isinstance(rec.get(name), list) and r < len(rec[name])
                    and rec[name][r] is not None]
            return max(vals) if vals else None

        ranks.append({"rank": r, "peak_allocated_gib": peak("peak_allocated_gib"),
                      "reserved_gib": peak("peak_reserved_gib"), "device_total_gib": peak("gpu_mem_used_gib")})
    step_times = [rec["step_time_s"] for rec in kept if rec.get("step_time_s")]
    tps = [rec["tokens_per_s"] for rec in kept if rec.get("tokens_per_s")]
    losses = [rec.get("loss") for rec in records]
    return {"ranks": ranks, "steps": len(records), "steps_kept": len(kept),
            "step_time_s": statistics.median(step_times) if step_times else None,
            "tokens_per_s": statistics.median(tps) if tps else None,
            "loss_finite": bool(losses) and all(x is not None and math.isfinite(x) for x in losses),
            "breakdown_s": breakdown(kept)}


def breakdown(records: list[dict]) -> dict | None:
    """The median forward, backward and optimizer-step seconds (the slowest rank's, as the trainer records them);
    None where the trainer's records carry none of them (an older trainer: "not measured")."""
    parts: dict[str, float | None] = {}
    for part in PARTS:
        vals = [float(rec[part]) for rec in records if isinstance(rec.get(part), (int, float))]
        parts[part] = statistics.median(vals) if vals else None
    return parts if any(x is not None for x in parts.values()) else None


def prepare_depth(plan: dict, run_dir: Path) -> Path:
    """OUT/depth-N/plan.json, checked against this machine and its data packed (as `ulab train` does before its ranks
    start); what an earlier probe left there is removed. Raises PlanError / DataError with one line."""
    from worker.trainer.preflight import validate as check

    run_dir.mkdir(parents=True, exist_ok=True)
    for name in (DONE, OUTCOME_FILE, "metrics.jsonl"):
        (run_dir / name).unlink(missing_ok=True)
    plan_path = run_dir / "plan.json"
    plan_path.write_text(json.dumps(plan, indent=1))
    check(plan_path, run_dir)
    return plan_path


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (so the launch's, which inherits them) into `path`: `ulab probe` prints its
    result on stdout, and the ranks' lines belong in the log."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def launch(out: Path, depths: list[int]) -> int:
    """One launch (torchrun, or this Python alone for a one-rank plan) that trains `depths` in turn
    (worker/trainer/probe_ranks.py); the launch's exit code. It holds OUT's run lock, as `ulab train` holds its
    run directory's, and a stop is forwarded to it once."""
    from plan.launch import RANK_MODULE, nodes_and_ranks_per_node, torchrun_command
    from worker.trainer.launcher import _run_torchrun, hold_run_dir
    from worker.trainer.preflight import set_alloc_conf
    from worker.trainer.spec import RunSpec, load_plan

    first = depth_dir(out, depths[0]) / "plan.json"
    spec = RunSpec.from_plan(load_plan(first))
    set_alloc_conf(spec)
    if spec.offload_optimizer:
        from worker.trainer.cpu_info import share_cpu_info

        share_cpu_info()  # asked once here, read by the ranks (worker/trainer/cpu_info.py)
    lock = hold_run_dir(first, out, None)
    tail = ["worker.trainer.probe_ranks", "--out", str(out), "--depths", ",".join(map(str, depths))]
    if spec.world_size == 1:
        cmd = [sys.executable, "-m", *tail]
    else:
        nnodes, per_node = nodes_and_ranks_per_node(spec.spec)
        endpoint = os.environ.get("ULAB_RDZV_ENDPOINT")
        if nnodes > 1 and not endpoint:
            raise ProbeError(f"hardware.num_nodes: {nnodes} nodes: set ULAB_RDZV_ENDPOINT=host:port (and "
                             "ULAB_NODE_RANK) on every node")
        cmd = torchrun_command(first, out, nproc_per_node=per_node, nnodes=nnodes,
                               node_rank=int(os.environ.get("ULAB_NODE_RANK", "0")), rdzv_endpoint=endpoint,
                               rdzv_id=os.environ.get("ULAB_RDZV_ID"))
        cmd = cmd[:cmd.index(RANK_MODULE)] + tail  # the ranks run the depth loop instead of `ulab train`
    try:
        with _output_to(out / "launch.log"):
            return _run_torchrun(cmd, spec, lock)
    finally:
        lock.release()


def depth_outcome(run_dir: Path) -> tuple[str, str | None] | None:
    """("ok", None), ("oom" | "failed", reason) from what the ranks left in OUT/depth-N (its outcome record,
    plan/outcome.py); None if not reached."""
    if (run_dir / DONE).exists():
        return "ok", None
    found = read_outcome(run_dir, [run_dir / OUTCOME_FILE])
    if found is None:
        return None
    return ("oom" if found.cause == Cause.OOM else "failed"), found.message


def _log_tail(out: Path) -> str:
    try:
        lines = [s for s in (out / "launch.log").read_text(errors="replace").splitlines() if s.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def run_depths(out: Path, depths: list[int]) -> dict[int, tuple[str, str | None]]:
    """Every depth in as few launches as possible: one, unless a depth fails other than by running out of memory
    (then the depths after it get a launch of their own). An out-of-memory depth ends the probe: the deeper ones
    are "skipped". Each launch either trains a depth or marks the first it could not train failed, so this ends."""
    outcome: dict[int, tuple[str, str | None]] = {}
    left = list(depths)
    launches = 0
    while left:
        code = launch(out, left)
        launches += 1
        reached = False
        for d in list(left):
            got = depth_outcome(depth_dir(out, d))
            if got is None:
                break
            outcome[d], reached = got, True
            left.remove(d)
            if got[0] != "ok":
                break
        if left and not reached:  # the launch ended before any depth said anything: the first is failed
            outcome[left.pop(0)] = ("failed", _log_tail(out) or f"launch {describe_exit(code)}")
        if any(status == "oom" for status, _ in outcome.values()):
            for d in left:
                outcome[d] = ("skipped", "a smaller depth ran out of memory")
            left = []
    print(f"probe: {len(depths)} depth(s) in {launches} launch(es)", file=sys.stderr, flush=True)
    return outcome


def probe(data: dict, out: Path, depths: tuple[int, ...] = DEPTHS, steps: int = STEPS, full: bool = False) -> dict:
    """Run the probe of plan `data` into `out`; returns (and writes to out/probe.json) the result."""
    import torch

    from plan import validate

    cuda = torch.cuda.is_available()
    v = validate(data)
    if v.spec is None:
        first = v.errors[0] if v.errors else {"field": "plan", "message": "not valid"}
        raise ProbeError(f"{first['field']}: {first['message']}")
    spec = v.spec
    wanted = sorted({d for d in depths if 1 <= d <= full_depth(spec)} | ({full_depth(spec)} if full else set()))
    if not wanted:
        raise ProbeError(f"--depths: none of {list(depths)} is between 1 and the model's {full_depth(spec)} layers")
    out.mkdir(parents=True, exist_ok=True)
    corpus = write_data(out / "data.txt", spec.plan.training.seq_len)
    for d in wanted:
        prepare_depth(probe_plan(data, d, steps, str(corpus), cuda), depth_dir(out, d))
    t0 = time.perf_counter()
    outcome = run_depths(out, wanted)
    measured: list[dict] = []
    for d in wanted:
        status, reason = outcome[d]
        if status == "skipped":
            measured.append({"depth": d, "status": status, "reason": reason})
            continue
        measured.append({"depth": d, **read_depth(depth_dir(out, d), spec.world), "status": status, "reason": reason})
        print(f"probe: depth {d}: {status}" + (f" ({reason})" if reason else ""), file=sys.stderr, flush=True)
    result = summarize(data, measured, "cuda" if cuda else "cpu")
    result["wall_s"] = round(time.perf_counter() - t0, 1)  # the depths' launch(es), their data prepared before
    (out / RESULT).write_text(json.dumps(result, indent=1))
    return result


def probe_command(plan_path: Path, out: Path, request: dict | None) -> list[str]:
    """The worker's command for a run of kind "probe" (`request`: {"depths", "steps"} of POST .../probe)."""
    request = request or {}
    return [sys.executable, "-m", "worker.probe", "--plan", str(plan_path), "--out", str(out),
            "--depths", ",".join(str(d) for d in request.get("depths") or DEPTHS),
            "--steps", str(request.get("steps") or STEPS)]


def run_probe_cli(plan_path: Path, out: Path, depths: tuple[int, ...], steps: int, full: bool, text: bool) -> int:
    from worker.trainer.attempt import LockBusy
    from worker.trainer.data import DataError
    from worker.trainer.spec import PlanError, load_plan

    try:
        data = load_plan(plan_path)
        result = probe(data, out, depths, steps, full)
    except (PlanError, ProbeError, DataError, LockBusy) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    print(text_table(result) if text else json.dumps(result, indent=1), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m worker.probe` (the worker's command for a run of kind "probe")."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m worker.probe")
    p.add_argument("--plan", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--depths", default=",".join(map(str, DEPTHS)))
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--full", action="store_true")
    p.add_argument("--text", action="store_true")
    a = p.parse_args(argv)
    return run_probe_cli(a.plan, a.out, parse_depths(a.depths), a.steps, a.full, a.text)


def parse_depths(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"--depths: {text!r} is not a comma-separated list of layer counts") from None


if __name__ == "__main__":
    raise SystemExit(main())
