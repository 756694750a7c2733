"""The same training as `ulab train`, driven by a minimal loop: Accelerate (ParallelismConfig with the DeepSpeed SP
backend, so UlyssesSPAttentionHF and its data-loader adapter) + the same DeepSpeed config, model, data, optimizer,
schedule and token-normalized loss, and nothing else: no Trainer, no callbacks, no metrics, no memory tracking.

One rank; bench/trainer_overhead.py starts it with torchrun on the run directory `ulab train` prepared (its
data/stage0.npz). Writes RUN_DIR/bare.json on rank 0: the per-step losses (the whole step's loss, gathered once
after the loop), step times, the train seconds and the time spent in the token all_reduce.
Usage (per rank): python bench/bare_loop.py --plan P --run-dir D
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class Setup:
    """What `ulab train` builds for a run directory, built the same way without the Trainer: the run spec, the
    rank layout, the Accelerator (ParallelismConfig with the DeepSpeed SP backend and the run's DeepSpeed config),
    the model (the run's seed, attention, tiling and checkpointing), AdamW with its schedule, and a data loader
    over the stage's packed rows dealt round-robin over all ranks. bench/peer_alst.py builds its peer from it."""

    def __init__(self, plan: Path, run_dir: Path, *, document_attention: bool = True):
        import torch
        from accelerate import Accelerator
        from accelerate.parallelism_config import ParallelismConfig
        from accelerate.utils import DeepSpeedPlugin, DeepSpeedSequenceParallelConfig
        from torch.utils.data import DataLoader
        from transformers import default_data_collator, get_scheduler

        from plan.launch import deepspeed_config_resolved, effective_attn, parallelism
        from worker.trainer.attention import install_document_attention
        from worker.trainer.data import load_stage_rows
        from worker.trainer.modeling import build_model, enable_tiled_mlp
        from worker.trainer.sp_trainer import PackedRows, collate_packed
        from worker.trainer.spec import RunSpec, load_plan
        from worker.trainer.train import setup_distributed

        self.spec = spec = RunSpec.from_plan(load_plan(plan))
        self.rank, self.world, self.device = setup_distributed()
        cuda = self.device == "cuda"
        attn = effective_attn(spec.plan, cuda=cuda)
        self.stage = stage = spec.stages[0]
        par = parallelism(spec.spec, stage.seq_len, cuda=cuda)
        self.parallelism_config = ParallelismConfig(
            sp_backend=par["sp_backend"], sp_size=par["sp_size"], dp_shard_size=par["dp_shard_size"],
            sp_handler=DeepSpeedSequenceParallelConfig(sp_seq_length=par["sp_seq_length"],
                                                       sp_seq_length_is_variable=par["sp_seq_length_is_variable"],
                                                       sp_attn_implementation=attn))
        self.accelerator = Accelerator(parallelism_config=self.parallelism_config, deepspeed_plugin=DeepSpeedPlugin(
            hf_ds_config=deepspeed_config_resolved(spec.spec)))
        self.model = model = build_model(spec, attn)
        if document_attention:  # packed documents attend within themselves, as in train.py
            install_document_attention(attn, model.config)
        if spec.tiled_mlp:
            enable_tiled_mlp(model)
        if spec.activation_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        run = spec.run
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=stage.learning_rate, weight_decay=run.weight_decay,
                                           fused=True)
        self.scheduler = get_scheduler(stage.lr_scheduler, self.optimizer, num_warmup_steps=stage.warmup_steps,
                                       num_training_steps=stage.steps)
        rows = load_stage_rows(run_dir, 0)
        if spec.run.eval_rows:
            rows = {k: v[:-spec.run.eval_rows] for k, v in rows.items()}
        samples_per_step = spec.micro_batch_size * spec.grad_accum * spec.dp_size
        unit = spec.world_size * spec.micro_batch_size
        length = -(-(stage.steps * samples_per_step) // unit) * unit
        dataset = PackedRows(rows, offset=0, length=length, sp=spec.sp_size, dp=spec.dp_size,
                             grad_accum=spec.grad_accum, micro_batch=spec.micro_batch_size)
        # batches dealt round-robin over all ranks (what data.step_row lays the rows out for, and what the Trainer's
        # loader does); Accelerate's own sharding under a ParallelismConfig mesh does not split them here
        mb, world = spec.micro_batch_size, self.world
        mine = list(range(self.rank * mb, len(dataset), world * mb))
        # the trainer's collator carries each micro batch's document layout (found on the host) where documents
        # attend within themselves; the peer's rows are one document each and take the plain collator
        collate = collate_packed if document_attention else default_data_collator
        self.loader = DataLoader(dataset, batch_size=mb, collate_fn=collate,
                                 sampler=[i + e for i in mine for e in range(mb) if i + e < len(dataset)])
        # NCCL reduces device tensors only (gloo, on CPU ranks or ranks sharing a GPU, takes either)
        self.on = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True, type=Path)
    ap.add_argument("--run-dir", required=True, type=Path)
    a = ap.parse_args()

    import torch

    from worker.trainer.attention import documents

    s = Setup(a.plan, a.run_dir)
    spec, stage, accelerator, rank, world, device, on = (s.spec, s.stage, s.accelerator, s.rank, s.world, s.device,
                                                           s.on)
    model, optimizer, scheduler = accelerator.prepare(s.model, s.optimizer, s.scheduler)
    # the data loader on its own, then the Ulysses adapter, as the Trainer does (trainer.py): Accelerate then deals
    # batches round-robin over all ranks, the order data.step_row lays the rows out for
    dl = accelerator.deepspeed_ulysses_dl_adapter(accelerator.prepare(s.loader), model)
    dp = world // spec.sp_size
    model.train()
    losses, norms, step_times, reduce_s = [], [], [], 0.0
    batches = iter(dl)
    t_train = time.perf_counter()
    for _ in range(stage.steps):
        t0 = time.perf_counter()
        # the Ulysses adapter shifts and shards the labels; with sp_size 1 there is none, and the batch has `labels`
        # (sp_trainer.py shifts them the same way)
        micro = [b if "shift_labels" in b else {**b, "shift_labels": torch.nn.functional.pad(
            b["labels"][..., 1:], (0, 1), value=-100)} for b in (next(batches) for _ in range(spec.grad_accum))]
        n = torch.tensor([sum(int((b["shift_labels"] != -100).sum()) for b in micro)], dtype=torch.int64, device=on)
        t_r = time.perf_counter()
        torch.distributed.all_reduce(n)  # N of the step over the world: the loss's denominator (sp_trainer.py)
        reduce_s += time.perf_counter() - t_r
        scale = dp / int(n.item())
        part = torch.zeros((), dtype=torch.float64)
        for b in micro:
            with documents(b["documents"]):  # the micro batch's document layout, found on the host (train.py's)
                logits = model(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False).logits.float()
                labels = b["shift_labels"].to(logits.device)
                loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1),
                                                         ignore_index=-100, reduction="sum") * scale
                accelerator.backward(loss)
            part += loss.detach().double().cpu() / dp
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(part)
        norms.append(float(model.get_global_grad_norm() or 0.0))
        if device == "cuda":
            torch.cuda.synchronize()  # the step's kernels, as the trainer's step clock waits for them
        step_times.append(time.perf_counter() - t0)
    train_s = time.perf_counter() - t_train
    total = torch.stack(losses).to(on)
    torch.distributed.all_reduce(total)  # the whole step's loss: the ranks' shares add up (once, after the loop)
    if rank == 0:
        (a.run_dir / "bare.json").write_text(json.dumps({
            "losses": total.cpu().tolist(), "grad_norms": norms, "step_times": step_times, "train_s": train_s,
            "token_all_reduce_s": reduce_s}))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
