"""Where each rank's model states live, recorded once per stage after its first optimizer step: the facts that show
ZeRO-3 and optimizer offload acting (the planner counts them: plan/memory.py state_terms) and the allocator setting
the ranks started with.

RUN_DIR/states.jsonl, one line per stage (rank 0 writes it; every rank contributes its row):
  {"stage": i, "zero_stage": z, "ranks": [{"rank": r, "param_elements": held, "param_elements_total": total,
   "optimizer": "DeepSpeedCPUAdam", "optimizer_offload": true, "optimizer_state_bytes": n,
   "optimizer_state_devices": ["cpu"], "optimizer_steps": 1, "alloc_conf": "expandable_segments:True"}, ...]}

param_elements: the parameter elements this rank keeps between forwards (its ZeRO-3 partition `ds_tensor`, else
the whole parameter); optimizer_steps: the largest `step` in the optimizer's per-parameter state (1 after the first
step: these are the states that step).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import TrainerCallback

from plan.launch import ALLOC_CONF_ENV


def _inner_optimizer(optimizer):
    """(ZeRO optimizer or None, the torch optimizer that steps) through Accelerate's and DeepSpeed's wrappers."""
    zero, opt = None, optimizer
    while getattr(opt, "optimizer", None) is not None:
        if hasattr(opt, "cpu_offload") or hasattr(opt, "offload_optimizer"):
            zero = opt
        opt = opt.optimizer
    return zero, opt


def rank_states(model, optimizer) -> dict:
    held = total = 0
    for p in model.parameters():
        if hasattr(p, "ds_tensor"):  # ZeRO-3: the partition this rank owns; p.data is empty between forwards
            held += p.ds_tensor.numel()
            total += p.ds_numel
        else:
            held += p.numel()
            total += p.numel()
    zero, opt = _inner_optimizer(optimizer)
    state_bytes, devices, steps = 0, set(), 0
    for st in getattr(opt, "state", {}).values():
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.numel() > 1:
                state_bytes += v.numel() * v.element_size()
                devices.add(v.device.type)
            elif k == "step":
                steps = max(steps, int(v))
    offload = bool(getattr(zero, "cpu_offload", False) or getattr(zero, "offload_optimizer", False))
    return {"param_elements": held, "param_elements_total": total, "optimizer": type(opt).__name__,
            "optimizer_offload": offload, "optimizer_state_bytes": state_bytes,
            "optimizer_state_devices": sorted(devices), "optimizer_steps": steps,
            "alloc_conf": os.environ.get(ALLOC_CONF_ENV)}


class StatesCallback(TrainerCallback):
    def __init__(self, trainer, run_dir: Path, stage_index: int, zero_stage: int):
        self.trainer, self.path, self.stage, self.zero_stage = trainer, Path(run_dir) / "states.jsonl", stage_index, \
            zero_stage
        self.done = False

    def on_step_end(self, args, state, control, **kw):
        if self.done:
            return
        self.done = True
        row = {"rank": torch.distributed.get_rank() if torch.distributed.is_initialized() else 0,
               **rank_states(self.trainer.model, self.trainer.optimizer)}
        rows: list[dict | None] = [row]
        if torch.distributed.is_initialized():
            rows = [None] * torch.distributed.get_world_size()  # each rank's row, gathered in place
            torch.distributed.all_gather_object(rows, row)
        if row["rank"] == 0:
            with open(self.path, "a") as f:
                f.write(json.dumps({"stage": self.stage, "zero_stage": self.zero_stage, "ranks": rows}) + "\n")
