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
import json
import os
import re
import shutil
import sys
import time
import traceback
from pathlib import Path

import torch

from plan.launch import deepspeed_config, effective_attn, parallelism, training_arguments
from plan.outcome import EXIT_CODE, Cause, Outcome, write_outcome

from .attempt import ATTEMPT_ENV, metrics_file
from .attention import install_document_attention
from .callbacks import STOP, GuardCallback, StepMetricsCallback, install_stop_handler
from .checkpoints import latest_checkpoint
from .collectives import check_shared_run_dir, share_cores
from .data import hold_back, last_row_padded, load_stage_rows, tokenizer_for
from .evaluate import passkey, position_loss
from .exits import EXIT_OK, error_cause, say_last_words, says_out_of_memory
from .metrics import MemoryMeter, MetricsWriter, peak_tflops
from .modeling import TiledLossHead, build_model, enable_tiled_mlp
from .net import free_port
from .phases import FirstStepEnd
from .stop_rules import Guard, inherited_reference

# bench/gpu_check.py's switches (not for runs of the service): leave out the last stage's model save (GBs a row, read
# by nobody there), and let several ranks share one GPU
SKIP_FINAL_SAVE_ENV = "ULAB_TRAINER_SKIP_FINAL_SAVE"
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
    entry turned the collector off for the imports (cli.gc_off_for_imports): one collection here frees their
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
    """Train one stage; returns the callback (which knows whether SIGTERM stopped it; `guard.fired`, whether a stop
    rule did)."""
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig
    from transformers import TrainingArguments

    from .sp_trainer import PackedRows, UlyssesTrainer, collate_packed
    from .state_placement import StatesCallback

    stage = spec.stages[stage_index]
    step_offset = sum(s.steps for s in spec.stages[:stage_index])
    init_from = str(Path(run_dir) / "stages" / f"stage{stage_index - 1}") if stage_index > 0 else None
    pc = None
    if spec.sp_size > 1:
        par = parallelism(spec.spec, stage.seq_len, cuda=torch.cuda.is_available())
        pc = ParallelismConfig(sp_backend=par["sp_backend"], sp_size=par["sp_size"], dp_shard_size=par["dp_shard_size"],
                               sp_handler=DeepSpeedSequenceParallelConfig(
                                   sp_seq_length=par["sp_seq_length"],
                                   sp_seq_length_is_variable=par["sp_seq_length_is_variable"],
                                   sp_attn_implementation=attn))
    samples_per_step = spec.micro_batch_size * spec.grad_accum * spec.dp_size
    length = stage.steps * samples_per_step
    unit = spec.world_size * spec.micro_batch_size
    length = -(-length // unit) * unit
    # the last complete rows, never trained on: the loss-by-position evaluation's (evaluate.py)
    rows, eval_rows = hold_back(load_stage_rows(run_dir, stage_index), spec.run.eval_rows,
                                last_row_padded(run_dir, stage_index))
    dataset = PackedRows(rows, offset=(step_offset + steps_done) * samples_per_step, length=length,
                         sp=spec.sp_size, dp=spec.dp_size, grad_accum=spec.grad_accum,
                         micro_batch=spec.micro_batch_size)
    # random weights are drawn before the DeepSpeed config exists, so ZeRO-3's zero.Init does not partition them
    # at creation (which would draw different numbers per layout); checkpoints load under zero.Init
    model = build_model(spec, attn) if init_from is None and spec.model_path is None else None
    out_dir = Path(run_dir) / "checkpoints" / f"stage{stage_index}"
    args = TrainingArguments(
        output_dir=str(out_dir), deepspeed=deepspeed_config(spec.spec), parallelism_config=pc,
        save_strategy="no", save_total_limit=spec.keep_checkpoints, logging_strategy="no", report_to="none",
        disable_tqdm=True, ignore_data_skip=True, dataloader_num_workers=0, remove_unused_columns=False,
        ddp_backend=None, **training_arguments(spec.plan, stage, cuda=torch.cuda.is_available()),
    )
    if model is None:
        model = build_model(spec, attn, init_from=init_from)
    if not install_document_attention(attn, model.config) and rank == 0 and stage_index == 0:
        print(f"attention: {attn} with Transformers' own masks (a sliding-window model or a kernel without "
              "document support)", flush=True)
    trainer = UlyssesTrainer(model=model, args=args, train_dataset=dataset, data_collator=collate_packed,
                             sp_size=spec.sp_size, zero_stage=spec.zero_stage,
                             tiled_logits=spec.tiled_logits_loss, checkpoint_offload=spec.checkpoint_offload,
                             first_step=steps_done if resume_from else 0, upcast_logits=spec.upcast_logits,
                             liger_loss=spec.liger_fused_loss)
    if spec.tiled_mlp:  # after the Trainer applied Liger (if asked): TiledMLP tiles the MLP forward the model has now
        enable_tiled_mlp(model)
    if rank == 0 and stage_index == 0:  # which loss runs (`make gpu-check` reads it; the planner counts the same)
        print(f"loss: {trainer.loss_kind}", flush=True)
    cb = StepMetricsCallback(trainer, writer=writer, step_offset=step_offset, stage_index=stage_index,
                             seq_len=stage.seq_len, model_config=model.config, peak_tflops=peak_tflops(spec.spec),
                             checkpoint_every=spec.checkpoint_every,
                             memory=MemoryMeter(spec.run.track_memory, spec.run.memory_every),
                             run_spec=spec, document_len=spec.plan.training.document_len)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    evaluated: set[int] = set()
    live = {"model": model}  # emptied at the end of the stage: the callback (returned) must not keep the model

    def evaluate_positions(step: int) -> None:
        """Loss by position on the held-back rows (every rank; rank 0 writes the record)."""
        if eval_rows is None:  # no rows held back (run.eval_rows 0): nothing to score
            return
        record = position_loss(live["model"], eval_rows, stage.seq_len, device)
        evaluated.add(step)
        if writer is not None:
            writer.write({"step": step, "stage": stage_index, **record, "time": time.time()})

    if eval_rows is not None and spec.run.eval_every:
        cb.evaluate_every = (spec.run.eval_every, evaluate_positions)
    if os.environ.get("ULAB_TRAINER_BARE") != "1":  # bench/trainer_overhead.py measures the loop without it
        trainer.add_callback(cb)
        if guard is not None:  # after cb: it reads the step's gathered loss from it
            trainer.add_callback(GuardCallback(cb, guard))
        trainer.add_callback(StatesCallback(trainer, run_dir, stage_index, spec.zero_stage))  # state_placement.py
    first_step = FirstStepEnd()
    trainer.add_callback(first_step)
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    if rank == 0:
        t1 = time.perf_counter()
        with open(Path(run_dir) / "stage_timings.jsonl", "a") as f:
            f.write(json.dumps({"stage": stage_index, "steps": trainer.state.global_step - (steps_done if resume_from
                                else 0), "train_s": t1 - t0,
                                "after_first_step_s": t1 - first_step.at if first_step.at else None}) + "\n")
    stopped = cb.stopped_by_signal or (guard is not None and guard.fired is not None)
    if not stopped:  # the stage's evaluations of its final model
        last = step_offset + stage.steps
        if eval_rows is not None and last not in evaluated:
            evaluate_positions(last)
        for after, test in spec.plan.passkey_tests():
            if after == stage_index:
                record = passkey(model, tokenizer_for(spec.tokenizer_path), test.test_lengths(spec.sp_size),
                                 test.depths, test.trials, spec.seed, device)
                if writer is not None:
                    writer.write({"step": last, "stage": stage_index, **record, "time": time.time()})
    cb.evaluate_every = None
    live.clear()
    head = model.get_output_embeddings()
    if isinstance(head, TiledLossHead):  # save a plain model (stage i+1 and users load it as such)
        model.set_output_embeddings(head.head)
    last_stage = stage_index == len(spec.stages) - 1
    if not stopped and not (last_stage and os.environ.get(SKIP_FINAL_SAVE_ENV) == "1"):
        trainer.save_model(str(Path(run_dir) / "stages" / f"stage{stage_index}"))
    trainer.accelerator.free_memory()
    engine = getattr(trainer, "model_wrapped", None)
    destroy = getattr(engine, "destroy", None)  # DeepSpeed's engine; a plain module has none
    if destroy is not None:
        destroy()
    del destroy
    del trainer, model, engine
    gc.collect()
    return cb


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
