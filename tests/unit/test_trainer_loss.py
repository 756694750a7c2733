"""`training.upcast_logits` acts in the trainer's own loss (UlyssesTrainer.compute_loss, one CPU process, no
DeepSpeed): off, a bf16 model's loss holds half the bytes the fp32 upcast holds, as plan.memory counts them; the
losses agree to bf16's precision."""
from __future__ import annotations

import pytest
import torch

from plan.memory import loss_bytes_per_token
from tests.tiny import TINY_LLAMA

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
SEQ, VOCAB = 512, 8192  # a vocabulary large enough that the loss's [t, V] tensors are the peak


def loss_peak(tmp_path, upcast: bool) -> tuple[float, int]:
    """(loss, peak bytes created) of one forward and backward through UlyssesTrainer.compute_loss."""
    from transformers import TrainingArguments

    from worker.trainer.metrics import TensorMemoryTracker
    from worker.trainer.modeling import build_model
    from worker.trainer.sp_trainer import UlyssesTrainer
    from worker.trainer.spec import RunSpec

    cfg = {**TINY_LLAMA, "vocab_size": VOCAB}
    spec = RunSpec.from_plan({
        "model": {"config": cfg}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 1, "num_nodes": 1},
        "parallel": {"sp_size": 1, "dp_size": 1},
        "training": {"seq_len": SEQ, "dtype": "bf16", "zero_stage": 0, "activation_checkpointing": False,
                     "attn_implementation": "sdpa", "upcast_logits": upcast},
        "run": {"steps": 1, "learning_rate": 1e-3, "seed": 0, "data": {"path": "unused"}, "model_path": None}})
    model = build_model(spec, "sdpa")
    model.train()
    args = TrainingArguments(output_dir=str(tmp_path / str(upcast)), use_cpu=True, report_to="none",
                             disable_tqdm=True)
    trainer = UlyssesTrainer(model=model, args=args, upcast_logits=spec.upcast_logits)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (1, SEQ), generator=g)
    batch = {"input_ids": ids, "position_ids": torch.arange(SEQ).unsqueeze(0), "labels": ids.clone()}
    trainer._scale = 1.0 / (SEQ - 1)
    tracker = TensorMemoryTracker()
    tracker.register(model.parameters())
    with tracker:
        loss = trainer.compute_loss(model, batch)
        loss.backward()
        value = float(loss)
        del loss
    return value, tracker.peak_created


def test_the_loss_on_bf16_logits_holds_half_the_bytes_of_the_fp32_upcast(tmp_path):
    on_loss, on_peak = loss_peak(tmp_path, True)
    off_loss, off_peak = loss_peak(tmp_path, False)
    planned_drop = (loss_bytes_per_token(VOCAB, 2, True) - loss_bytes_per_token(VOCAB, 2, False)) * SEQ
    assert planned_drop == 6 * VOCAB * SEQ  # 12V -> 6V per token in bf16
    # a no-op switch leaves the peak where it was; the trainer's drop is the planner's within 5%
    assert abs((on_peak - off_peak) - planned_drop) <= 0.05 * planned_drop, (on_peak, off_peak, planned_drop)
    assert abs(off_loss - on_loss) <= 0.02 * on_loss, (on_loss, off_loss)
