"""The host side of a training step: the Python and dispatch work of Transformers' modules, Accelerate, the Trainer,
DeepSpeed's hooks and the per-micro-batch bookkeeping. On a GPU the device cannot finish a step before the host has
issued it, so the host time is a floor under the step.

The constants are measured by bench/host_overhead.py (one CPU rank, torchrun + gloo, a 4- and a 32-layer Llama of
hidden 64 at 256 tokens, the least of steps 3..12; the table and the command are in docs/host-overhead.md). Each is
the per-layer slope between the two depths or the part that does not grow with depth. At that width a layer's
arithmetic is a small part of its time, so the figures include a little CPU arithmetic: an upper bound of the host
work alone. ZeRO-0 and ZeRO-1 read as ZeRO-2 (their hooks are a subset of its).

How host and device overlap:
- ZeRO-3: the parameter coordinator lets the host run at most a few module fetches ahead of the device: past
  `__max_ongoing_fetch_events` = 2 fetches in flight it synchronizes on the oldest (DeepSpeed 0.19.8
  runtime/zero/partitioned_param_coordinator.py, lines 142 and 401-404). Host and device are coupled layer by layer,
  so each layer takes the longer of its host and its device time.
- ZeRO-0/1/2: nothing waits on the device inside a micro batch; the host runs ahead and the forward and backward
  take the longer of the two totals.
- The per-micro-batch fixed part (the Trainer's loop, loss scaling, the engine's bookkeeping) runs between micro
  batches and adds to the step.
"""
from __future__ import annotations

# Seconds per decoder layer and micro batch (bench/host_overhead.py; docs/host-overhead.md lists every run): per
# variant and phase the least `per layer` figure the runs gave, at 64 or 256 tokens (each is an upper bound of the
# host's part: tokens add arithmetic and the shared machine adds waits; the least is the tightest). forward: the
# forward pass; backward: the backward without activation checkpointing; recompute: what checkpointing adds to the
# backward (the -ac variant's backward less the plain one's); optimizer: the step's per-layer part.
HOST_LAYER_S = {
    2: {"forward": 0.985e-3, "backward": 1.911e-3, "recompute": 0.305e-3, "optimizer": 0.305e-3},
    3: {"forward": 2.815e-3, "backward": 2.407e-3, "recompute": 3.293e-3, "optimizer": 0.516e-3},
}
# TiledMLP: seconds per sequence shard per MLP (forward and backward together): z3-ac-tiled less z3-ac per-layer
# forward + backward at 256 tokens, over its 4 shards (256 tokens / hidden 64): 2.25 and 2.54 ms in two runs.
HOST_TILED_SHARD_S = 2.25e-3
# The part that does not grow with depth, per micro batch: z3-ac-ga2 less z3-ac step-time intercepts, 5.75 ms at 64
# tokens and 10.1 ms at 256. The one-micro-batch intercepts (3-14 ms) leave nothing per optimizer step beyond it
# (the intercepts of a two-depth fit on a shared machine are good to a few ms).
HOST_MICRO_BATCH_S = 5.75e-3


def _stage(spec) -> int:
    return 3 if spec.zero_stage == 3 else 2


def layer_s(spec) -> float:
    """Host seconds of one decoder layer in one micro batch (forward, backward, recompute, TiledMLP's shards)."""
    h = HOST_LAYER_S[_stage(spec)]
    s = h["forward"] + h["backward"]
    if spec.activation_checkpointing:
        s += h["recompute"]
    if spec.tiled_mlp:
        s += tiled_shards(spec) * HOST_TILED_SHARD_S
    return s


def tiled_shards(spec) -> int:
    """TiledMLP's shards per MLP: ceil(local tokens / hidden) (worker/trainer/modeling.py enable_tiled_mlp)."""
    h = spec.model.hidden_size
    return max(1, -(-spec.local_tokens // h))


def optimizer_s(spec) -> float:
    """Host seconds of the optimizer step's per-layer work (the engine's loop over its parameter groups)."""
    return spec.model.num_hidden_layers * HOST_LAYER_S[_stage(spec)]["optimizer"]


def exposed_s(spec, device_layer_s: float, device_micro_s: float) -> float:
    """Seconds the host adds to the forward and backward of a step (ga micro batches), given the device's time of
    one layer and of one whole micro batch (layers, head and loss, communication on the critical path)."""
    L, ga = spec.model.num_hidden_layers, spec.grad_accum
    host_layer = layer_s(spec)
    if spec.zero_stage == 3:
        per_micro = L * max(0.0, host_layer - device_layer_s)
    else:
        per_micro = max(0.0, L * host_layer - device_micro_s)
    return ga * (per_micro + HOST_MICRO_BATCH_S)
