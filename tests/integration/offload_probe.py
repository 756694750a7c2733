"""One process (gloo, world 1): a tiny Llama with activation checkpointing in a DeepSpeed engine of each ZeRO stage
given, one forward and backward inside the trainer's checkpoint-offload context (worker/trainer/offload.py), with
DeepSpeed's offload engine allowed to offload CPU tensors (on CPU ranks it keeps them in place). Prints one JSON line
per stage: layers, marked, taken by the checkpoints, offloaded, restored, kept on the device.

    python -m tests.integration.offload_probe 2 3 [--deepspeed-marker]

--deepspeed-marker uses DeepSpeed's own `CheckpointHiddenStatesOffload` (its `__call__` marker) instead: the
code before the fix, for comparison."""
from __future__ import annotations

import json
import os
import sys

import torch


def main(stages: list[int], deepspeed_marker: bool) -> None:
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"})
    from worker.trainer.net import free_port

    os.environ["MASTER_PORT"] = str(free_port())
    import deepspeed
    from deepspeed.runtime.activation_checkpointing.offload_activations import CheckpointHiddenStatesOffload
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.tiny import TINY_LLAMA
    from worker.trainer.offload import LayerInputOffload, mark_checkpointed_inputs

    deepspeed.comm.init_distributed(dist_backend="gloo")

    def allow_cpu(cls):
        class Offloading(cls):
            def _should_skip(self, tensor):  # DeepSpeed's rule without "only from an accelerator"
                return isinstance(tensor, torch.nn.Parameter) or self._num_bytes(tensor) < self.min_offload_bytes

        return Offloading

    cfg = dict(TINY_LLAMA)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    for stage in stages:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 1,
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
        engine, *_ = deepspeed.initialize(model=model, config=ds,
                                          optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))
        if deepspeed_marker:
            offload = allow_cpu(CheckpointHiddenStatesOffload)(use_pin_memory=False, use_streams=False)
            layers = model.config.num_hidden_layers
        else:
            offload = allow_cpu(LayerInputOffload)(use_pin_memory=False, use_streams=False)
            layers = mark_checkpointed_inputs(model, offload)
        ids = torch.randint(0, config.vocab_size, (1, 128))
        with offload:
            out = engine(input_ids=ids, labels=ids, use_cache=False)
            engine.backward(out.loss)
            s = offload.stats
            row = {"stage": stage, "layers": layers, "marked": s.marked_tensors,
                   "taken": getattr(offload, "consumed", s.offloaded_tensors + s.kept_last_tensors),
                   "offloaded": s.offloaded_tensors, "restored": s.restored_tensors, "kept_last": s.kept_last_tensors,
                   "loss": float(out.loss)}
        engine.step()
        print(json.dumps(row), flush=True)
        engine.destroy()


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:] if a.isdigit()], "--deepspeed-marker" in sys.argv)
