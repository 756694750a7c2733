"""ULAB_TRAINER_PROFILE_STEP=K: the rank profiles its K-th optimizer step, from step begin to step end, and writes the
ops it ran (calls and self time) to RUN_DIR/profile/step{K}-rank{R}.json (worker/trainer/step_profile.py)."""
from __future__ import annotations

import json

import torch
from transformers import TrainerControl, TrainerState

from worker.trainer.step_profile import PROFILE_STEP_ENV, StepProfile, profile_step


def test_only_the_asked_step_is_profiled_and_its_ops_are_counted(tmp_path):
    cb = StepProfile(2, tmp_path, rank=1)
    state, control = TrainerState(), TrainerControl()
    a = torch.randn(32, 32)
    for step, matmuls in ((1, 1), (2, 3), (3, 5)):
        state.global_step = step - 1  # the Trainer counts finished steps: the step begins at global_step + 1
        cb.on_step_begin(None, state, control)
        for _ in range(matmuls):
            torch.mm(a, a)
        torch.softmax(a, dim=-1)
        state.global_step = step
        cb.on_step_end(None, state, control)
    assert [p.name for p in (tmp_path / "profile").iterdir()] == ["step2-rank1.json"]
    ops = json.loads((tmp_path / "profile" / "step2-rank1.json").read_text())
    assert ops["aten::mm"]["calls"] == 3  # step 2's matmuls, none of steps 1 and 3
    assert ops["aten::_softmax"]["calls"] == 1
    assert ops["aten::mm"]["self_cpu_us"] > 0


def test_the_step_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(PROFILE_STEP_ENV, raising=False)
    assert profile_step() is None
    monkeypatch.setenv(PROFILE_STEP_ENV, "4")
    assert profile_step() == 4
