"""The model: a Hugging Face checkpoint (local directory or hub id) or an architecture built from `model.config`
with random weights; plus the ALST switches that change the model's compute (TiledMLP, checkpoint offload)."""
from __future__ import annotations

import contextlib
import math

import torch

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_model(spec, attn_implementation: str, init_from: str | None = None):
    """`init_from` (a directory saved by a previous stage) wins over `run.model_path` and `model.config`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = TORCH_DTYPES[spec.dtype]
    source = init_from or spec.model_path
    if source is not None:
        model = AutoModelForCausalLM.from_pretrained(source, attn_implementation=attn_implementation, dtype=dtype)
    else:
        cfg = dict(spec.model_config)
        model_type = cfg.pop("model_type", "llama")
        for k in ("architectures", "torch_dtype", "dtype", "transformers_version"):
            cfg.pop(k, None)
        config = AutoConfig.for_model(model_type, **cfg)
        torch.manual_seed(spec.seed)  # the same random weights on every rank and in every run with this seed
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    model.config.use_cache = False
    # TiledMLP is enabled later (stage.build), after the Trainer applied Liger's kernels, so that it tiles
    # whatever MLP forward the model then has (Liger's fused SwiGLU with training.liger_kernel)
    if spec.tiled_logits_loss:
        enable_tiled_logits_loss(model, spec.zero_stage, spec.upcast_logits)
    return model


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor, upcast: bool = True) -> torch.Tensor:
    """The cross-entropy summed over the target tokens (labels -100 are skipped), as an fp32 scalar.
    upcast (`training.upcast_logits`, Transformers' ForCausalLMLoss): on an fp32 copy of the logits. Otherwise on
    the model's dtype, as ms-swift's sequence-parallel loss does: every [t, V] tensor of the loss in bf16 (half the
    bytes); each token's loss is summed in fp32 so the step's loss keeps its precision."""
    flat, target = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    if upcast:
        return torch.nn.functional.cross_entropy(flat.float(), target, ignore_index=-100, reduction="sum")
    per_token = torch.nn.functional.cross_entropy(flat, target, ignore_index=-100, reduction="none")
    return per_token.float().sum()


def enable_tiled_mlp(model) -> int:
    """Route every gated MLP (gate/up/down projections) through DeepSpeed's `TiledMLP`: the MLP runs over
    ceil(seqlen / hidden) sequence shards and is recomputed shard by shard in backward, so its
    intermediate activations never exist for the whole sequence. Each shard runs the MLP's forward as it is when
    this is called (Transformers' or Liger's fused SwiGLU). Returns the number of MLPs patched."""
    import types

    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    def tiled_forward(self, x):
        params = [self.down_proj.weight, self.gate_proj.weight, self.up_proj.weight]
        return TiledMLP.apply(lambda mlp, shard: mlp._ulab_untiled_forward(shard), self, x,
                              mlp_shards(x.shape[-2], x.shape[-1]), params)

    n = 0
    for module in model.modules():
        if all(hasattr(module, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            if not hasattr(module, "_ulab_untiled_forward"):
                module._ulab_untiled_forward = module.forward
                module.forward = types.MethodType(tiled_forward, module)
            n += 1
    if n == 0:
        raise ValueError("training.tiled_mlp: this model has no gated MLP (gate_proj/up_proj/down_proj) to tile")
    return n


def mlp_shards(seqlen: int, hidden: int) -> int:
    """Sequence shards of a TiledMLP call: ceil(seqlen / hidden), DeepSpeed's rule (TiledMLP.tiled_mlp_forward).
    Every rank must use the same count (ZeRO-3 gathers inside each shard); the count depends only on the shapes,
    which every rank of a step shares (packed rows are seq_len long; Ulysses shards them equally), so no rank asks
    the others and nothing is read back from the device."""
    return max(1, math.ceil(seqlen / hidden))


def checkpoint_offloader(enabled: bool):
    """The activation-checkpoint offload context (offload.LayerInputOffload, DeepSpeed's engine) or a null context.
    Needs activation checkpointing, and `offload.mark_checkpointed_inputs` on the model.

    One instance serves every micro batch (entered once per micro batch): its pool of pinned host buffers then
    outlives the step, instead of pinning fresh host memory for every micro batch. DeepSpeed offloads only from an
    accelerator (on CPU ranks the marked inputs are taken by the checkpoint and kept where they are)."""
    if not enabled:
        return contextlib.nullcontext()
    from .offload import LayerInputOffload

    cuda = torch.cuda.is_available()
    return LayerInputOffload(use_pin_memory=cuda, use_streams=cuda)


def loss_shards(tokens: int, vocab: int) -> int:
    """Shards of the tiled logits loss: ALST's (ArcticTraining) about 1 GiB of fp32 logits each, the planner's
    rule and constant (plan.memory.tiled_loss_shard_tokens, TILED_LOSS_SHARD_BYTES), read at call time. Like
    `mlp_shards`, a function of the shapes: every rank gets the same count without asking the others."""
    from plan import memory

    return max(1, math.ceil(tokens / max(1, memory.TILED_LOSS_SHARD_BYTES // (4 * vocab))))


class TiledLossHead(torch.nn.Module):
    """Stands in for the model's lm_head when `tiled_logits_loss` is on: given the final hidden states it returns
    the token-loss sum (times `scale`) as a [1, 1, 1] "logits" tensor, computing logits one sequence shard at a
    time (`loss_shards`: about 1 GiB of fp32 logits per shard), never for the whole sequence.

    It runs inside the model's forward and calls the real lm_head as a submodule, like DeepSpeed's TiledMLP does,
    so ZeRO-3 gathers the partitioned weight through its module hooks (calling the head from outside the
    engine's forward gave wrong lm_head gradients under ZeRO-3 + Ulysses: the loss drifted from the untiled run).
    ZeRO 0-2: DeepSpeed's `TiledFusedLogitsLoss` (backward shard by shard inside forward, no recompute).
    ZeRO-3: DeepSpeed's `sequence_tiled_compute` (no-grad forward, recompute per shard in backward).
    """

    def __init__(self, head: torch.nn.Module, zero_stage: int, upcast: bool = True):
        super().__init__()
        self.head = head
        self.zero_stage = zero_stage
        self.upcast = upcast  # training.upcast_logits: each shard's loss on fp32 logits
        self.labels = None
        self.scale = 1.0

    @property
    def weight(self):  # tied-embedding code paths look for lm_head.weight
        return self.head.weight

    def forward(self, hidden):
        if self.labels is None:  # generation / evaluation: a plain head
            return self.head(hidden)
        from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss, sequence_tiled_compute

        labels, scale, head, upcast = self.labels, self.scale, self.head, self.upcast
        bs, seqlen = hidden.shape[:2]
        shards = loss_shards(bs * seqlen, head.out_features)  # the same on every rank: from the shapes alone

        def shard_loss(hidden, labels):
            return token_loss_sum(head(hidden), labels, upcast) * scale

        if self.zero_stage == 3:
            shards = min(shards, seqlen)
            while shards > 1 and math.ceil(seqlen / shards) * (shards - 1) >= seqlen:
                shards -= 1  # every shard non-empty
            loss = sequence_tiled_compute(shard_loss, seqlen, shards, {"hidden": hidden, "labels": labels}, {},
                                          "hidden", compute_params=[head.weight], output_unshard_dimension=0,
                                          output_reduction="sum")
        else:
            n = bs * seqlen
            shards = min(shards, n)
            while n % shards:  # torch.chunk must give exactly `shards` pieces
                shards -= 1
            loss = TiledFusedLogitsLoss.apply(lambda _self, x, y: shard_loss(x, y), head, hidden, labels, None,
                                              shards, [head.weight], "sum")
        return loss.reshape(1, 1, 1)


def enable_tiled_logits_loss(model, zero_stage: int, upcast: bool = True) -> TiledLossHead:
    wrapper = TiledLossHead(model.get_output_embeddings(), zero_stage, upcast)
    model.set_output_embeddings(wrapper)
    return wrapper
