"""`UlyssesTrainer`: the Transformers Trainer with a token-normalized loss and per-step bookkeeping.

Loss. One optimizer step covers grad_accum micro-batches on every data-parallel rank, and under Ulysses SP each
micro-batch is split along the sequence over the SP group. The loss of the step is
    L = sum of token cross-entropies over the whole step / N,   N = number of target tokens in the whole step
(labels != -100 after the causal shift), the same whatever the layout (DP, SP, GAS). `_get_num_items_in_batch`
counts N once per step with one all-reduce over the world; each rank then back-propagates
    dp * (its own token-loss sum) / N
because DeepSpeed sums the gradients of all sp*dp ranks and divides by dp (ZeRO's reduction divides by
world / sequence_parallel_size: stage_1_and_2.py, stage3.py). Ulysses shards are disjoint, so the sum over
ranks of the per-rank sums is the sum over the step. `loss_is_scaled_for_ga` tells the Trainer not to divide
again. The reported loss is the all-reduced sum of (token-loss sum / N) over ranks: exactly L.
"""
from __future__ import annotations

import math
from collections.abc import Sized

import torch
from torch.utils.data import Dataset, SequentialSampler
from transformers import Trainer, default_data_collator

from .attention import DocumentLayout, documents
from .data import step_row
from .modeling import checkpoint_offloader, token_loss_sum
from .phases import PhaseTimer


class PackedRows(Dataset):
    """The packed rows of one stage seen from row `offset` on, cycling, in the order that makes every optimizer
    step train consecutive rows whatever the sp x dp x grad_accum layout (data.step_row): item i is row
    (offset + step_row(i)) % rows."""

    def __init__(self, rows: dict, offset: int, length: int, *, sp: int = 1, dp: int = 1, grad_accum: int = 1,
                 micro_batch: int = 1):
        self.rows = dict(rows)  # numpy: a row is copied out of it without a torch op (below)
        self.n = self.rows["input_ids"].shape[0]
        self.offset, self.length = offset, length
        self.layout = {"sp": sp, "dp": dp, "grad_accum": grad_accum, "micro_batch": micro_batch}
        self.per_step = micro_batch * grad_accum * dp
        # target tokens of each row after the causal shift (what every rank's shift_labels count adds up to)
        labels = self.rows.get("labels")
        self.targets = None if labels is None else [int(n) for n in (labels[:, 1:] != -100).sum(axis=1).tolist()]

    def step_targets(self, k: int) -> int:
        """N of the dataset's k-th optimizer step: the target tokens of the rows it trains (data.step_row: step k
        trains rows offset + k*P .. offset + k*P + P-1), the same number every rank's all_reduce would give."""
        assert self.targets is not None
        first = self.offset + k * self.per_step
        return sum(self.targets[(first + j) % self.n] for j in range(self.per_step))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict:
        r = (self.offset + step_row(i, **self.layout)) % self.n
        # a copy of the row, made by numpy: a torch view's storage is the whole stage's array, which the CPU memory
        # meter (metrics.TensorMemoryTracker counts storages) counted in every step that fetched a batch (1.4 MiB
        # for the test corpus, as much as the step's activations)
        return {k: torch.from_numpy(v[r].copy()) for k, v in self.rows.items()}


def collate_packed(features: list[dict]) -> dict:
    """Transformers' default collation plus the micro batch's `DocumentLayout`, found here on the host from the rows'
    position_ids (CPU tensors), so attention never reads them back from the device. Under Ulysses, DeepSpeed's data
    adapter hands every non-tensor entry of a rank's batch to the SP group (all_gather_object) unsharded: each micro
    batch keeps the layout of its whole rows."""
    batch = default_data_collator(features)
    batch["documents"] = DocumentLayout(batch["position_ids"].numpy())
    return batch


class UlyssesTrainer(Trainer):
    loss_is_scaled_for_ga = True

    def __init__(self, *args, sp_size: int = 1, zero_stage: int = 0, tiled_logits: bool = False,
                 checkpoint_offload: bool = False, first_step: int = 0, upcast_logits: bool = True,
                 liger_loss: bool = False, **kwargs):
        super().__init__(*args, **kwargs)  # applies Liger's kernels to the model when args.use_liger_kernel
        self.tiled_logits = tiled_logits
        self.upcast_logits = upcast_logits  # training.upcast_logits (model.token_loss_sum)
        # Liger's fused linear cross-entropy (no logits tensor): the model computes the loss from shift_labels.
        # `liger_loss` is the plan's training_fields.liger_fused_loss (not with the tiled logits loss, which owns the
        # head; under ZeRO-3 DeepSpeed gathers the lm_head weight Liger reads, as that property says), the rule the
        # planner counts the loss's memory by; it needs Liger applied (use_liger_kernel).
        self.liger_loss = liger_loss and bool(self.args.use_liger_kernel)
        self.zero_stage = zero_stage
        self.offload = checkpoint_offloader(checkpoint_offload)  # one context for every micro batch
        if checkpoint_offload:  # the mark sits on each layer's forward: after ZeRO-3's pre-hooks (offload.py)
            from .offload import mark_checkpointed_inputs

            if self.model is None:
                raise ValueError("model: checkpoint offload marks the model's layers, and no model was given")
            mark_checkpointed_inputs(self.model, self.offload)
        self.world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        self.dp = self.world // max(1, sp_size)
        # ZeRO-3 hands Ulysses gradients back at 1/sp of what ZeRO-1/2 (and one process) give: measured, the grad
        # norm it reports is exactly 1/sp with identical losses. Scaling the backward by sp makes the reported
        # norm, and so gradient clipping, agree across ZeRO stages; Adam's update does not depend on the scale.
        self.grad_factor = sp_size if (zero_stage == 3 and sp_size > 1) else 1
        self._scale = 1.0
        self.first_step = first_step  # global_step when this Trainer starts (a resumed stage: the checkpoint's)
        self.targets_checked = False  # N counted locally is checked against the all_reduce once per stage
        self.step_loss: torch.Tensor | None = None  # this rank's share of the step's loss (on its device)
        self.step_tokens = 0  # input tokens this rank processed in the step (its shards)
        self.step_targets = 0  # N of the step (whole world)
        self.grad_norm: torch.Tensor | float | None = None  # this step's, on the device until the step ends
        self.last_grad_norm: float | None = None
        self.last_lr: float | None = None
        self.loss_sum, self.loss_steps = 0.0, 0  # the steps' whole losses L, as StepMetricsCallback gathers them
        self.phases = PhaseTimer()  # forward here; backward and optimizer on the engine (phases.time_engine)

    # data: in order, so a step sees the same rows whatever the layout (the shuffle, if any, is in the data)
    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if not isinstance(dataset, Sized):
            raise TypeError(f"train_dataset: the in-order sampler needs a dataset with a length, not {dataset!r}")
        return SequentialSampler(dataset)

    def _get_num_items_in_batch(self, batch_samples, device):
        n = 0
        for b in batch_samples:
            if "shift_labels" in b:  # Ulysses SP adapter: already shifted and sharded
                n += int((b["shift_labels"] != -100).sum())
            else:
                n += int((b["labels"][..., 1:] != -100).sum())
        ds = self.train_dataset
        if isinstance(ds, PackedRows) and ds.targets is not None:
            # every rank holds the stage's rows: N of the step without a collective (and no host-device sync on a
            # GPU). The first step of the stage checks it against the all_reduce it replaces.
            total = ds.step_targets(self.state.global_step - self.first_step)
            if not self.targets_checked:
                self.targets_checked = True
                summed = self._all_reduce_count(n, device)
                if summed != total:
                    raise RuntimeError(f"target tokens of step {self.state.global_step + 1}: {summed} counted by the "
                                       f"ranks, {total} from the rows (data.step_row's layout does not hold)")
        else:
            total = self._all_reduce_count(n, device)
        if total == 0:
            raise RuntimeError("a training step has no target tokens (all labels are -100)")
        self._scale = self.dp * self.grad_factor / total
        self.step_targets = total
        return total

    @staticmethod
    def _all_reduce_count(n: int, device) -> int:
        t = torch.tensor([n], dtype=torch.int64, device=device)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(t)
        return int(t.item())

    @property
    def loss_kind(self) -> str:
        """Which loss this Trainer computes, in words (train.py prints it once)."""
        if self.tiled_logits:
            return "tiled logits loss (the lm_head and the loss shard by shard; no whole logits tensor)"
        if self.liger_loss:
            return "Liger fused linear cross-entropy (no logits tensor)"
        return f"cross-entropy on {'fp32' if self.upcast_logits else 'the model dtype'} logits"

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        with self.phases.phase("forward_s"):
            return self._compute_loss(model, inputs, return_outputs)

    def _compute_loss(self, model, inputs, return_outputs):
        inputs = dict(inputs)
        shift_labels = inputs.pop("shift_labels", None)
        labels = inputs.pop("labels", None)
        if shift_labels is None:
            shift_labels = torch.nn.functional.pad(labels[..., 1:], (0, 1), value=-100)
        shift_labels = shift_labels.to(inputs["input_ids"].device)
        self.step_tokens += inputs["input_ids"].numel()
        fwd = {"input_ids": inputs["input_ids"], "position_ids": inputs["position_ids"]}
        if self.tiled_logits:  # the model's lm_head is a TiledLossHead: it returns the scaled loss sum
            head = (model.module if hasattr(model, "module") else model).get_output_embeddings()
            head.labels, head.scale = shift_labels, self._scale
            try:
                outputs = model(**fwd, use_cache=False)
            finally:
                head.labels = None
            loss = outputs.logits.reshape(())
        elif self.liger_loss:  # Liger divides its token-loss sum by num_items_in_batch: 1/scale makes it sum*scale
            outputs = model(**fwd, shift_labels=shift_labels, num_items_in_batch=1.0 / self._scale, use_cache=False)
            loss = outputs.loss
        else:
            outputs = model(**fwd, use_cache=False)
            loss = token_loss_sum(outputs.logits, shift_labels, self.upcast_logits) * self._scale
        part = loss.detach().double() / (self.dp * self.grad_factor)  # stays on the device: read once per step
        self.step_loss = part if self.step_loss is None else self.step_loss + part
        return (loss, outputs) if return_outputs else loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        # the layout serves this micro batch's forward and its backward (activation checkpointing recomputes)
        with self.offload, documents(inputs.get("documents")):
            return super().training_step(model, inputs, num_items_in_batch)

    def _clip_grad_norm(self, model):
        wrapped = getattr(self.accelerator, "deepspeed_engine_wrapped", None)
        if wrapped is None:
            return super()._clip_grad_norm(model)
        # DeepSpeed clipped inside its step (the config's gradient_clipping); its norm stays on the device here
        # (Accelerate's getter reads it back, before the Trainer's optimizer step)
        return wrapped.engine.get_global_grad_norm()

    def _get_grad_norm(self, model, grad_norm=None):
        wrapped = getattr(self.accelerator, "deepspeed_engine_wrapped", None)
        if grad_norm is None:
            grad_norm = (wrapped.engine.get_global_grad_norm() if wrapped is not None
                         else super()._get_grad_norm(model))
        self.grad_norm = grad_norm  # read after the step, with the step's other figures (take_step_figures)
        return grad_norm

    def _get_learning_rate(self):
        lr = super()._get_learning_rate()
        self.last_lr = float(lr)
        return lr

    def log(self, logs: dict, start_time: float | None = None) -> None:
        # The Trainer's closing `train_loss` averages what this rank's compute_loss returned: its share of each
        # step's loss (under SP=2 with ZeRO-1/2 about half of it). Report the mean of the whole steps' losses.
        if "train_loss" in logs and self.loss_steps:
            logs = {**logs, "train_loss": self.loss_sum / self.loss_steps}
        super().log(logs, start_time)

    def take_step_figures(self) -> tuple[float, int]:
        """This rank's share of the step's loss and its tokens, read once the optimizer step is done (the grad norm is
        read here too, not before the optimizer step where the Trainer computes it)."""
        loss, tokens = (float(self.step_loss) if self.step_loss is not None else 0.0), self.step_tokens
        self.step_loss = None
        self.step_tokens = 0
        g, self.grad_norm = self.grad_norm, None
        self.last_grad_norm = float(g) if g is not None else None
        return loss, tokens

    def take_step_phases(self) -> dict[str, float]:
        """This rank's forward_s, backward_s, optimizer_s of the step that ended (phases.py)."""
        return self.phases.take()


def finite_or_none(x):
    return x if (x is not None and math.isfinite(x)) else None
