"""One rank of a run: distributed set-up, then each stage (progressive context extension) as a Transformers
Trainer with Accelerate `ParallelismConfig(sp_backend="deepspeed")` and the generated DeepSpeed config.

Layout of RUN_DIR:
  metrics.jsonl                       one line per optimizer step (rank 0) of attempt 1 (attempt.py);
  metrics.attempt-N.jsonl             of attempt N >= 2, from the step after the checkpoint it resumed (or 1)
  run.lock                            held by every process of the live attempt; names it (attempt.py)
  data/stage{i}.npz                   packed rows per stage (written by the CLI before the ranks start)
  checkpoints/stage{i}/checkpoint-K   Trainer + DeepSpeed checkpoints (K counts inside the stage; last K kept)
  stages/stage{i}/                    the model at the end of stage i (stage i+1 starts from it)
  outcome.json                        how the attempt ended (plan/outcome.py): the first failing rank's, then
                                      the launcher's
"""
from __future__ import annotations

import gc
import os
import re
import shutil
import sys
import traceback
from pathlib import Path

import torch

from plan.launch import effective_attn
from plan.outcome import EXIT_CODE, Cause, Outcome, write_outcome

from .attempt import ATTEMPT_ENV, metrics_file
from .callbacks import STOP, install_stop_handler
from .checkpoints import latest_checkpoint
from .collectives import check_shared_run_dir, share_cores
from .exits import EXIT_OK, error_cause, say_last_words, says_out_of_memory
from .metrics import MetricsWriter
from .net import free_port
from .stage import build as build_stage
from .stop_rules import Guard, inherited_reference

# bench/gpu_check.py's switch (not for runs of the service): let several ranks share one GPU
SHARE_DEVICE_ENV = "ULAB_TRAINER_SHARE_DEVICE"


def setup_distributed() -> tuple[int, int, str]:
    """(rank, world, device type). A single process without torchrun becomes a world of one."""
    if "LOCAL_RANK" not in os.environ:
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    cuda = torch.cuda.is_available()
    # bench/gpu_check.py's Ulysses row on a one-GPU machine: every rank on the node's devices in turn, over gloo
    # (NCCL refuses two ranks on one device; gloo serves CUDA tensors by copying through the host)
    share = os.environ.get(SHARE_DEVICE_ENV) == "1"
    if cuda:
        local = int(os.environ["LOCAL_RANK"])
        if share:  # Accelerate and DeepSpeed's engine put each rank on cuda:LOCAL_RANK: make that an existing device
            local %= torch.cuda.device_count()
            os.environ["LOCAL_RANK"] = str(local)
        torch.cuda.set_device(local)
    # the node's cores, shared between its ranks (torchrun leaves each at OMP_NUM_THREADS=1): torch's CPU ops on CPU
    # ranks, DeepSpeedCPUAdam's OpenMP loop with the optimizer offloaded
    share_cores(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    deepspeed = import_deepspeed()
    # on CPU, Accelerate's SP set-up asserts unless DeepSpeed's comm is up before the Trainer is built
    deepspeed.comm.init_distributed(dist_backend="nccl" if cuda and not share else "gloo")
    return torch.distributed.get_rank(), torch.distributed.get_world_size(), "cuda" if cuda else "cpu"


def import_deepspeed():
    """DeepSpeed, imported with mlflow hidden from it. DeepSpeed's import runs its autotuner module, which imports
    mlflow when it is installed (autotuning/autotuner.py: `try: import mlflow`), for an autotuner this trainer never
    starts: mlflow and the pandas and pyarrow it pulls in were 122 of the ~445 start-up samples of a CPU rank
    (py-spy, a 20-step tiny run). The ranks forward nothing to trackers (the worker does, worker/trackers.py), and
    mlflow stays importable afterwards; a process that has imported mlflow already keeps it."""
    hide = "mlflow" not in sys.modules
    if hide:
        sys.modules["mlflow"] = None  # type: ignore[assignment]  # `import mlflow` raises ImportError meanwhile
    try:
        import deepspeed
    finally:
        if hide:
            del sys.modules["mlflow"]
    return deepspeed


def settle_imports() -> None:
    """Import what the stages use, then move every object alive (modules, classes, the libraries' tables) out of
    the garbage collector's sight (`gc.freeze`): the Trainer's `free_memory` and the end of a stage each run a full
    `gc.collect()`, which walked all of them every time (110 of a CPU rank's ~445 start-up samples). The rank's
    entry turned the collector off for the imports (rank.gc_off_for_imports): one collection here frees their
    garbage, and the collector is on from here."""
    import accelerate.parallelism_config  # noqa: F401
    from transformers import Trainer  # noqa: F401

    gc.collect()
    gc.freeze()
    gc.enable()


class _Attention:
    """Ulysses replaces the core attention entry; restore it before the next stage registers again."""

    def __init__(self, name: str):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.name, self.table = name, ALL_ATTENTION_FUNCTIONS
        self.original = ALL_ATTENTION_FUNCTIONS[name]

    def reset(self) -> None:
        self.table[self.name] = self.original
        from deepspeed.runtime.sequence_parallel import parallel_state_sp
        from deepspeed.utils import groups

        parallel_state_sp._release_sequence_parallel_groups()
        for attr in ("_SEQUENCE_PARALLEL_GROUP", "_SEQUENCE_DATA_PARALLEL_GROUP"):
            if hasattr(groups, attr):
                setattr(groups, attr, None)


def run_stage(spec, run_dir: Path, stage_index: int, *, resume_from: Path | None, steps_done: int,
              attn: str, writer, rank: int, guard: Guard | None = None):
    """Train one stage (stage.py: build, train, finish); returns its metrics callback (which knows whether SIGTERM
    stopped it; `guard.fired`, whether a stop rule did)."""
    built = build_stage(spec, run_dir, stage_index, resume_from=resume_from, steps_done=steps_done, attn=attn,
                        writer=writer, rank=rank, guard=guard)
    built.finish(stopped=built.train())
    return built.metrics


def train_this_rank(spec, run_dir: Path, resume: bool) -> int:
    run_dir = Path(run_dir)
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get(ATTEMPT_ENV, "1"))  # `ulab train` tags itself and every rank with it
    install_stop_handler()
    try:
        rank, world, device = setup_distributed()
        if world != spec.world_size:
            raise RuntimeError(f"the plan needs {spec.world_size} ranks (sp_size*dp_size) but torchrun started {world}")
        if world > int(os.environ.get("LOCAL_WORLD_SIZE", world)):  # ranks on other nodes write nothing locally
            check_shared_run_dir(run_dir, rank, world, spec.num_nodes)
        attn = effective_attn(spec.plan, cuda=device == "cuda")
        if rank == 0 and attn != spec.attn_implementation:
            print(f"training.attn_implementation {spec.attn_implementation!r} needs CUDA; these CPU ranks use "
                  f"{attn!r}", flush=True)
        start_stage, resume_from, steps_done = 0, None, 0
        if resume:
            found = latest_checkpoint(run_dir)
            if found is None:
                raise RuntimeError(f"--resume: no checkpoint under {run_dir / 'checkpoints'}")
            start_stage, resume_from, steps_done = found
        writer = None
        if rank == 0:
            # every attempt writes a file of its own (attempt.py), never another's: a shipper may be reading that
            mine = metrics_file(run_dir, attempt)
            mine.unlink(missing_ok=True)
            writer = MetricsWriter(mine)
        attention = _Attention(attn)
        settle_imports()
        guard = Guard(spec.run, inherited_reference(resume_from))  # this attempt's stop rules (stop_rules.py)
        for i in range(start_stage, len(spec.stages)):
            if i > start_stage:
                attention.reset()
            cb = run_stage(spec, run_dir, i, resume_from=resume_from if i == start_stage else None,
                           steps_done=steps_done if i == start_stage else 0, attn=attn, writer=writer, rank=rank,
                           guard=guard)
            if guard.fired is not None and guard.reason is not None:  # a stop rule fired: the checkpoint is saved
                if rank == 0:
                    guard.write(run_dir, attempt)
                return _fail(run_dir, rank, guard.reason, guard.cause, quiet_trace=True, step=guard.fired[1])
            if cb.stopped_by_signal:
                return _fail(run_dir, rank, f"preempted: signal {STOP['signal']} on rank {rank}; checkpoint saved, "
                                            f"continue with --resume", Cause.SIGNAL, quiet_trace=True)
            if rank == 0 and i > 0:  # the previous stage's checkpoints are superseded by its final model
                shutil.rmtree(run_dir / "checkpoints" / f"stage{i - 1}", ignore_errors=True)
            torch.distributed.barrier()
        if writer is not None:
            writer.close()
        torch.distributed.barrier()
        return EXIT_OK
    except Exception as e:  # every failure ends with one line
        return failed(run_dir, rank, e)
    finally:
        close_distributed()


def failed(run_dir: Path, rank: int, e: Exception) -> int:
    """A rank's failure as its exit code and one line (written by _fail): out of memory (torch's error, or a
    RuntimeError that says so), no space left on device, or `rank R: Type: first line`. The trainer's and the
    probe's ranks both end so."""
    if isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and says_out_of_memory(str(e))):
        return _oom(run_dir, rank, e)
    cause, line = error_cause(e, f"rank {rank}: {type(e).__name__}: {_first_line(e)}")
    return _fail(run_dir, rank, line, cause)


def close_distributed() -> None:
    """Leave the process group, whatever state the failure left it in."""
    try:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    except Exception:
        pass


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else repr(e)


_UNITS = {"GiB": 1024**3, "MiB": 1024**2, "KiB": 1024, "GB": 1e9, "MB": 1e6, "bytes": 1, "B": 1}


def _oom(run_dir: Path, rank: int, e: BaseException) -> int:
    """One line `out of memory on rank R: tried to allocate X GiB`."""
    m = re.search(r"allocate\s+([\d.]+)\s*(GiB|MiB|KiB|GB|MB|bytes|B)\b", str(e), re.IGNORECASE)
    gib = float(m.group(1)) * _UNITS.get(m.group(2), 1) / 1024**3 if m else None
    size = f": tried to allocate {gib:.2f} GiB" if gib is not None else ""
    return _fail(run_dir, rank, f"out of memory on rank {rank}{size} ({type(e).__name__})", Cause.OOM)


def _fail(run_dir: Path, rank: int, line: str, cause: Cause, quiet_trace: bool = False, step: int | None = None,
          exit_code: int | None = None) -> int:
    """Say the failure's one line and record it (RUN_DIR/outcome.json, unless a rank recorded a failure first);
    answers the exit code (the cause's, or `exit_code`)."""
    code = EXIT_CODE[cause] if exit_code is None else exit_code
    say_last_words(line)  # first: on a full disk, the writes below fail
    write_outcome(run_dir, Outcome(cause, code, line, step=step, rank=rank), first=True)
    try:
        if not quiet_trace:
            traceback.print_exc(file=sys.stderr)
    except OSError:
        pass
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass
    return code
