"""One stage of a run (progressive context extension) in three parts, which train.run_stage runs in turn:
`build` (the stage's rows, its model and the Trainer with the per-step callbacks), `Stage.train` (the Trainer's
loop; what happens at each optimizer step lives in the callbacks, callbacks.py) and `Stage.finish` (the evaluations
of the stage's final model, its saved model for the next stage, the engine freed)."""
from __future__ import annotations

import gc
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from plan.launch import deepspeed_config, parallelism, training_arguments

from .attention import install_document_attention
from .callbacks import GuardCallback, StepMetricsCallback
from .data import hold_back, last_row_padded, load_stage_rows, tokenizer_for
from .evaluate import passkey, position_loss
from .metrics import MemoryMeter, peak_tflops
from .modeling import TiledLossHead, build_model, enable_tiled_mlp
from .phases import FirstStepEnd
from .step_profile import StepProfile, profile_step
from .stop_rules import Guard

# bench/gpu_check.py's switch (not for runs of the service): leave out the last stage's model save (GBs a row, read
# by nobody there)
SKIP_FINAL_SAVE_ENV = "ULAB_TRAINER_SKIP_FINAL_SAVE"


@dataclass
class Stage:
    """A built stage: its Trainer, model and per-step metrics callback, and the rows held back for evaluation."""
    spec: Any
    run_dir: Path
    index: int
    step_offset: int  # the run's steps before this stage
    steps_done: int  # of this stage, by the checkpoint it resumes from
    resume_from: Path | None
    writer: Any
    rank: int
    guard: Guard | None
    trainer: Any
    model: Any
    metrics: StepMetricsCallback
    eval_rows: Any
    device: torch.device
    evaluated: set[int] = field(default_factory=set)

    @property
    def plan(self):
        return self.spec.stages[self.index]

    def evaluate_positions(self, step: int) -> None:
        """Loss by position on the held-back rows (every rank; rank 0 writes the record)."""
        if self.eval_rows is None:  # no rows held back (run.eval_rows 0): nothing to score
            return
        record = position_loss(self.model, self.eval_rows, self.plan.seq_len, self.device)
        self.evaluated.add(step)
        if self.writer is not None:
            self.writer.write({"step": step, "stage": self.index, **record, "time": time.time()})

    def train(self) -> bool:
        """The stage's optimizer steps; whether a stop (SIGTERM or a stop rule) ended them early."""
        first_step = FirstStepEnd()
        self.trainer.add_callback(first_step)
        t0 = time.perf_counter()
        self.trainer.train(resume_from_checkpoint=str(self.resume_from) if self.resume_from else None)
        if self.rank == 0:
            t1 = time.perf_counter()
            steps = self.trainer.state.global_step - (self.steps_done if self.resume_from else 0)
            with open(Path(self.run_dir) / "stage_timings.jsonl", "a") as f:
                f.write(json.dumps({"stage": self.index, "steps": steps, "train_s": t1 - t0,
                                    "after_first_step_s": t1 - first_step.at if first_step.at else None}) + "\n")
        return self.metrics.stopped_by_signal or (self.guard is not None and self.guard.fired is not None)

    def finish(self, stopped: bool) -> None:
        """The evaluations of the stage's final model (unless stopped), its save for the next stage, and the engine
        and model freed: the metrics callback, which outlives the stage, keeps neither."""
        spec, model = self.spec, self.model
        if not stopped:
            last = self.step_offset + self.plan.steps
            if self.eval_rows is not None and last not in self.evaluated:
                self.evaluate_positions(last)
            for after, test in spec.plan.passkey_tests():
                if after == self.index:
                    record = passkey(model, tokenizer_for(spec.tokenizer_path), test.test_lengths(spec.sp_size),
                                     test.depths, test.trials, spec.seed, self.device)
                    if self.writer is not None:
                        self.writer.write({"step": last, "stage": self.index, **record, "time": time.time()})
        self.metrics.evaluate_every = None
        head = model.get_output_embeddings()
        if isinstance(head, TiledLossHead):  # save a plain model (stage i+1 and users load it as such)
            model.set_output_embeddings(head.head)
        last_stage = self.index == len(spec.stages) - 1
        if not stopped and not (last_stage and os.environ.get(SKIP_FINAL_SAVE_ENV) == "1"):
            self.trainer.save_model(str(Path(self.run_dir) / "stages" / f"stage{self.index}"))
        self.trainer.accelerator.free_memory()
        destroy = getattr(getattr(self.trainer, "model_wrapped", None), "destroy", None)  # DeepSpeed's engine
        if destroy is not None:
            destroy()
        del destroy, model
        self.trainer = self.model = None
        gc.collect()


def build(spec, run_dir: Path, stage_index: int, *, resume_from: Path | None, steps_done: int, attn: str, writer,
          rank: int, guard: Guard | None = None) -> Stage:
    """The stage's rows, model and Trainer, with the per-step callbacks registered."""
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
    built = Stage(spec, Path(run_dir), stage_index, step_offset, steps_done, resume_from, writer, rank, guard,
                  trainer, model, cb, eval_rows, device)
    if eval_rows is not None and spec.run.eval_every:
        cb.evaluate_every = (spec.run.eval_every, built.evaluate_positions)
    profiled = profile_step()
    if profiled is not None:  # bench/peer_alst.py --profile-step: before cb, so the metrics gather is not in it
        trainer.add_callback(StepProfile(profiled, run_dir, rank))
    if os.environ.get("ULAB_TRAINER_BARE") != "1":  # bench/trainer_overhead.py measures the loop without it
        trainer.add_callback(cb)
        if guard is not None:  # after cb: it reads the step's gathered loss from it
            trainer.add_callback(GuardCallback(cb, guard))
        trainer.add_callback(StatesCallback(trainer, run_dir, stage_index, spec.zero_stage))  # state_placement.py
    return built
