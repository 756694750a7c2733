"""A resume at another learning rate trains at it: the Trainer restores the checkpoint's scheduler, whose
base rates are the old run's; `apply_learning_rate` puts the plan's back, on the checkpoint's step count."""
from __future__ import annotations

import torch
from transformers import get_scheduler

from worker.trainer.callbacks import apply_learning_rate


def scheduler(name: str, lr: float):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)
    return get_scheduler(name, opt, num_warmup_steps=0, num_training_steps=100)


def test_a_resumed_scheduler_takes_the_plans_learning_rate_and_schedule():
    old = scheduler("constant", 10.0)
    for _ in range(4):
        old.optimizer.step()
        old.step()
    new = scheduler("cosine", 1e-3)
    new.load_state_dict(old.state_dict())  # what the Trainer does on resume
    new.optimizer.load_state_dict(old.optimizer.state_dict())  # and DeepSpeed with the optimizer
    assert new.optimizer.param_groups[0]["lr"] == 10.0  # without the fix the resume trains on at lr=10
    apply_learning_rate(new, 1e-3)
    cosine_at_4 = 0.5 * (1 + torch.cos(torch.tensor(torch.pi * 4 / 100))).item()
    assert abs(new.optimizer.param_groups[0]["lr"] - 1e-3 * cosine_at_4) < 1e-9
    new.optimizer.step()
    new.step()  # the next step follows the cosine from 1e-3
    assert abs(new.get_last_lr()[0] - 1e-3 * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * 5 / 100))).item()) < 1e-9
