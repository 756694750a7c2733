"""The per-step callback: gathers this step's figures from every rank (one all_gather), rank 0 writes the
metrics line; checkpoints every N steps and on SIGTERM (the stop flag travels in the same all_gather, so all
ranks stop after the same step)."""
from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import TrainerCallback

from .checkpoints import write_layout
from .collectives import all_gather_rows
from .metrics import GIB, MemoryMeter, MetricsWriter, StepClock, flops_per_token
from .phases import PHASES, time_engine
from .step_record import RankStep, gathered
from .stop_rules import Guard, newest_within_bounds
from .system import NAMES as SYSTEM_NAMES
from .system import SystemSampler

STOP = {"requested": False, "signal": None}


def install_stop_handler() -> None:
    def on_term(signum, _frame):
        STOP["requested"] = True
        STOP["signal"] = signum

    signal.signal(signal.SIGTERM, on_term)


def apply_learning_rate(scheduler, learning_rate: float) -> None:
    """The plan's learning rate over a resumed checkpoint's: the Trainer restores the scheduler (its base rates) and
    DeepSpeed the optimizer's rates from the checkpoint, so a resume with a new `run.learning_rate` would train on at
    the old one. The schedule itself (its lambdas) is the one the plan names; its step count is the checkpoint's.
    Called once the Trainer has loaded the checkpoint (on_train_begin); a fresh start is unchanged."""
    while scheduler is not None and not hasattr(scheduler, "lr_lambdas"):  # Accelerate's wrapper
        scheduler = getattr(scheduler, "scheduler", None)
    if scheduler is None:
        return
    scheduler.base_lrs = [learning_rate] * len(scheduler.base_lrs)
    for group, fn in zip(scheduler.optimizer.param_groups, scheduler.lr_lambdas, strict=True):
        group["initial_lr"] = learning_rate
        group["lr"] = learning_rate * fn(scheduler.last_epoch)
    scheduler._last_lr = [g["lr"] for g in scheduler.optimizer.param_groups]


class StepMetricsCallback(TrainerCallback):
    def __init__(self, trainer, *, writer: MetricsWriter | None, step_offset: int, stage_index: int, seq_len: int,
                 model_config, peak_tflops: float | None, checkpoint_every: int, memory: MemoryMeter,
                 run_spec=None, document_len: int | None = None):
        self.trainer = trainer
        self.writer = writer
        self.step_offset = step_offset
        self.stage_index = stage_index
        self.seq_len = seq_len
        self.flops_per_token = flops_per_token(model_config, seq_len, document_len)
        self.peak_tflops = peak_tflops
        self.every = checkpoint_every
        self.memory = memory
        self.run_spec = run_spec
        self.clock = StepClock()
        self.stopped_by_signal = False
        self.last_step_loss: tuple[int, float] | None = None
        self.last_overhead: float | None = None
        self.world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        self.rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.system = SystemSampler(torch.cuda.current_device() if memory.cuda else None)
        # (every N steps, fn(step)): the loss-by-position evaluation (stage.Stage.evaluate_positions)
        self.evaluate_every: tuple[int, Callable[[int], None]] | None = None

    def on_train_begin(self, args, state, control, **kw):
        apply_learning_rate(self.trainer.lr_scheduler, args.learning_rate)
        opt = self.trainer.optimizer
        while opt is not None and not isinstance(opt, torch.optim.Optimizer):  # Accelerate / DeepSpeed wrappers
            opt = getattr(opt, "optimizer", None)
        if self.rank == 0 and self.stage_index == 0:
            inner = self.trainer.optimizer
            while getattr(inner, "optimizer", None) is not None:  # Accelerate's and DeepSpeed's wrappers
                inner = inner.optimizer
            print(f"optimizer: {type(inner).__name__}; {torch.get_num_threads()} CPU threads per rank", flush=True)
        self.memory.track(self.trainer.model, opt)
        wrapped = getattr(self.trainer.accelerator, "deepspeed_engine_wrapped", None)
        if wrapped is not None:  # backward_s and optimizer_s (phases.py); forward_s: UlyssesTrainer.compute_loss
            time_engine(wrapped.engine, self.trainer.phases)
        self.trainer.take_step_phases()  # nothing before the first step counts

    def on_step_begin(self, args, state, control, **kw):
        """The timed step runs from here (its micro batches fetched) to on_step_end: what runs between two steps (a
        checkpoint save, the states gather, an evaluation, this callback's own gather) is not in either."""
        self._start(self.step_offset + state.global_step + 1)

    def on_save(self, args, state, control, **kw):
        if self.rank == 0 and self.run_spec is not None:  # which ranks wrote it: --resume checks it (checkpoints.py)
            write_layout(Path(args.output_dir) / f"checkpoint-{state.global_step}", self.run_spec)

    def _start(self, step: int):
        """Before the run's `step` (1-based)."""
        self.memory.begin_step(step)
        self.clock.start()

    def on_train_end(self, args, state, control, **kw):
        self.memory.abort()
        summary = getattr(getattr(self.trainer, "offload", None), "summary", None)  # offload.LayerInputOffload
        if self.rank == 0 and summary is not None:  # on CPU ranks DeepSpeed keeps them in place
            print(summary(), flush=True)  # offload_summary.LINE reads it back

    def on_substep_end(self, args, state, control, **kw):  # between micro-batches of one optimizer step
        self.memory.next_micro_batch()

    def on_step_end(self, args, state, control, **kw):
        t_enter = time.perf_counter()
        phases = self.trainer.take_step_phases()  # CUDA: waits for the step's last timing event
        step_time, cpu_time = self.clock.elapsed(), self.clock.cpu()
        mem = self.memory.end_step()
        loss_part, tokens = self.trainer.take_step_figures()
        mine = RankStep(loss_part=loss_part, tokens=tokens, stop=1.0 if STOP["requested"] else 0.0,
                        step_time_s=step_time, cpu_time_s=cpu_time, peak_allocated=_num(mem["allocated"]),
                        peak_reserved=_num(mem["reserved"]), peak_activations=_num(mem["activations"]),
                        target_tokens=self.trainer.step_targets, phases=tuple(phases[k] for k in PHASES),
                        system=tuple(self.system.sample()))
        ranks = gathered(all_gather_rows(mine.pack()))  # on the device the process group serves (NCCL: CUDA only)
        stop = any(r.stop > 0 for r in ranks)
        loss = sum(r.loss_part for r in ranks)  # the ranks' shares add up to the step's loss
        self.trainer.loss_sum += loss
        self.trainer.loss_steps += 1
        step = self.step_offset + state.global_step
        self.last_step_loss = (step, loss)  # the stop rules read it (GuardCallback, registered after this)
        if self.writer is not None:
            rec = self._record(step, loss, ranks, mem)
            rec["metrics_overhead_s"] = self.last_overhead  # time the previous step spent in this callback
            rec["time"] = time.time()  # wall clock (unix s) of the write: the worker stores it as the wall_time
            self.writer.write(rec)
        if stop:
            self.stopped_by_signal = True
            control.should_save = True
            control.should_training_stop = True
        elif self.every and step % self.every == 0:
            control.should_save = True
        if not stop and self.evaluate_every and step % self.evaluate_every[0] == 0:
            self.evaluate_every[1](step)  # every rank, in step (collectives inside)
        self.last_overhead = time.perf_counter() - t_enter
        return control

    def _record(self, step: int, loss: float, ranks: list[RankStep], mem: dict) -> dict:
        slowest = max(ranks, key=lambda r: r.step_time_s)  # the step ends when the slowest rank ends it
        step_time = slowest.step_time_s
        tokens = sum(r.tokens for r in ranks)
        tps = tokens / step_time if step_time > 0 else None
        tflops = self.flops_per_token * tokens / self.world / step_time / 1e12 if step_time > 0 else None
        rec = {
            "step": step,
            "loss": loss,
            "lr": self.trainer.last_lr,
            "grad_norm": self.trainer.last_grad_norm,
            "tokens_per_s": tps,
            "tokens_per_s_per_gpu": tps / self.world if tps is not None else None,
            "step_time_s": step_time,
            # each rank's CPU seconds in the step (all its threads): below step_time_s where it waited for the other
            # ranks or, on a shared host, for a core
            "cpu_time_s": [round(r.cpu_time_s, 4) for r in ranks],
            "tflops_per_gpu": tflops,
            # MFU = achieved model FLOPs per second per device / peak dense FLOPs of that device, with the model
            # FLOPs per token the planner counts (metrics.flops_per_token: 6N plus causal attention, no recompute)
            "mfu": (tflops / self.peak_tflops) if (tflops is not None and self.peak_tflops) else None,
            "peak_allocated_gib": [_gib(r.peak_allocated) for r in ranks],
            "peak_activations_gib": ([_gib(r.peak_activations) for r in ranks] if mem["activations"] is not None
                                     else None),
            "memory_measure": self.memory.name,
            # what the ranks actually ran on (1: CUDA GPUs, 0: CPU ranks); the API records it on the run
            "on_gpu": int(self.memory.cuda),
            "seq_len": self.seq_len,
            "tokens": int(tokens),
            "target_tokens": int(ranks[0].target_tokens),
            "stage": self.stage_index,
        }
        if mem["reserved"] is not None:
            rec["peak_reserved_gib"] = [_gib(r.peak_reserved) for r in ranks]
        if mem["allocated"] is not None:  # CPU ranks measure some steps only (metrics.MemoryMeter)
            rec["memory_step"] = self.memory.measured_step
        # the slowest rank's breakdown (so the three add up to at most step_time_s)
        rec.update(zip(PHASES, slowest.phases, strict=True))
        # one value per rank; none where no rank could read it
        for i, name in enumerate(SYSTEM_NAMES):
            values = [r.system[i] for r in ranks]
            if any(v == v for v in values):
                rec[name] = [round(v, 4) if v == v else None for v in values]
        return rec


def _num(v) -> float:
    return float("nan") if v is None else float(v)


def _gib(v: float):
    return None if v != v else round(v / GIB, 6)


class GuardCallback(TrainerCallback):
    """The stop rules of stop_rules.Guard at each step's end. Registered right after the metrics callback (it reads
    that step's gathered loss from it): stops training after this step, with a checkpoint, when a rule fires. Here,
    not in stop_rules.py, so the worker reads `stop_rules.read_stopped` without importing Transformers.

    It also keeps the newest checkpoint from before a divergence: each save records its step's loss (Guard.record),
    and while the step about to be saved is out of the rule's bounds, the last checkpoint within them is the Trainer's
    `best_model_checkpoint`, which its rotation (`run.keep_checkpoints`) never deletes. A healthy step leaves it unset,
    so rotation is as before."""

    def __init__(self, metrics, guard: Guard):
        self.metrics, self.guard = metrics, guard
        self.within_bounds: str | None = None  # the newest checkpoint whose step's loss was within bounds

    def on_train_begin(self, args, state, control, **kw):
        """A resumed attempt starts from the stage's checkpoints on disk: the newest within bounds stays protected."""
        self.within_bounds = newest_within_bounds(Path(args.output_dir))
        return control

    def on_step_end(self, args, state, control, **kw):
        seen = getattr(self.metrics, "last_step_loss", None)  # (step, loss) of the step just ended
        if seen is None or self.guard.fired is not None:
            return control
        step, loss = seen
        grad_norm = getattr(self.metrics.trainer, "last_grad_norm", None)
        grad = float(grad_norm) if isinstance(grad_norm, (int, float)) and not isinstance(grad_norm, bool) else None
        if self.guard.observe(step, float(loss) if loss is not None else math.nan, grad) is not None:
            control.should_save = True
            control.should_training_stop = True
        state.best_model_checkpoint = None if self.guard.divergence.within else self.within_bounds
        return control

    def on_save(self, args, state, control, **kw):
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if self.metrics.rank == 0:
            self.guard.record(checkpoint)
        if self.guard.divergence.within:
            self.within_bounds = str(checkpoint)
        if self.guard.fired is not None:  # rotation kept both; the Trainer's end (keep 1) must not delete the stop's
            state.best_model_checkpoint = None
        return control
