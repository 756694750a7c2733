"""The timed step (the metrics record's step_time_s, and each rank's cpu_time_s) runs from the Trainer's step begin to
its step end: what runs between two steps (a checkpoint save, the states gather, an evaluation) is in neither. A
stand-in clock, no sleeps."""
from __future__ import annotations

import json

from transformers import LlamaConfig, TrainerControl, TrainerState

from worker.trainer import metrics
from worker.trainer.callbacks import StepMetricsCallback
from worker.trainer.metrics import MemoryMeter, MetricsWriter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.cpu = 7.0  # this process's CPU seconds (every thread)

    def process_time(self) -> float:
        return self.cpu

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


class Trainer:  # the figures StepMetricsCallback reads from UlyssesTrainer
    step_targets, last_lr, last_grad_norm, loss_sum, loss_steps = 100, 1e-3, 1.0, 0.0, 0

    def take_step_figures(self):
        return 0.5, 64

    def take_step_phases(self):
        return {"forward_s": 0.1, "backward_s": 0.2, "optimizer_s": 0.05}


def test_a_checkpoint_save_between_steps_is_not_in_the_next_steps_time(monkeypatch, tmp_path):
    clock = Clock()
    monkeypatch.setattr(metrics, "time", clock)
    writer = MetricsWriter(tmp_path / "metrics.jsonl")
    cb = StepMetricsCallback(Trainer(), writer=writer, step_offset=0, stage_index=0, seq_len=64,
                             model_config=LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                      intermediate_size=128, vocab_size=512),
                             peak_tflops=None, checkpoint_every=1, memory=MemoryMeter(False))
    state, control = TrainerState(), TrainerControl()
    for step in (1, 2):
        cb.on_step_begin(None, state, control)
        clock.now += 2.0  # the step's forward, backward and optimizer step
        clock.cpu += 1.5  # its CPU seconds: the rest it waited (for the other ranks, or for a core)
        state.global_step = step
        cb.on_step_end(None, state, control)
        assert control.should_save  # checkpoint_every 1: the Trainer saves now, after on_step_end
        clock.now += 30.0  # the save (and the states gather after step 1)
        clock.cpu += 20.0
    writer.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step_time_s"] for r in records] == [2.0, 2.0], records
    assert [r["cpu_time_s"] for r in records] == [[1.5], [1.5]], records  # one figure per rank
