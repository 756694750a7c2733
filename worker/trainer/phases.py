"""Where one optimizer step's time goes on this rank: forward, backward and optimizer seconds, summed over the
step's micro-batches (the metrics record's `forward_s`, `backward_s`, `optimizer_s`).

forward    `UlyssesTrainer.compute_loss`: the model's forward and the loss (every micro-batch)
backward   the DeepSpeed engine's `backward` (every micro-batch; ZeRO's gradient reduction included)
optimizer  the DeepSpeed engine's `step` (clipping, the optimizer's update, zero_grad, the scheduler)

CPU ranks: `time.perf_counter` around each phase. CUDA: a pair of timing events around each phase, read once at
the end of the step (`take`), so nothing synchronizes the device in the middle of a step.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import TrainerCallback

PHASES = ("forward_s", "backward_s", "optimizer_s")


class PhaseTimer:
    def __init__(self, cuda: bool | None = None):
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self._totals = dict.fromkeys(PHASES, 0.0)
        self._events: list[tuple[str, Any, Any]] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((name, start, end))
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._totals[name] += time.perf_counter() - t0

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` timed as phase `name` (an engine's bound method, replaced on the instance)."""
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return fn(*args, **kwargs)
        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        return timed

    def take(self) -> dict[str, float]:
        """This step's seconds per phase; starts the next step's. CUDA: waits for the step's last event (the step
        has ended: its figures are about to be gathered)."""
        if self._events:
            self._events[-1][2].synchronize()
            for name, start, end in self._events:
                self._totals[name] += start.elapsed_time(end) / 1000.0
            self._events = []
        out, self._totals = self._totals, dict.fromkeys(PHASES, 0.0)
        return out


def time_engine(engine: Any, timer: PhaseTimer) -> None:
    """Times the DeepSpeed engine's backward and step (once per engine: a resumed stage keeps its wrappers)."""
    for method, name in (("backward", "backward_s"), ("step", "optimizer_s")):
        current = getattr(engine, method)
        if getattr(current, "__wrapped__", None) is None:
            # an instance attribute shadows the class's method (nn.Module.__setattr__ stores plain callables as is)
            object.__setattr__(engine, method, timer.wrap(name, current))


class FirstStepEnd(TrainerCallback):
    """When the Trainer's first step of the stage ended (perf_counter): stage_timings.jsonl's `after_first_step_s`
    counts from it, so a per-step figure leaves out the engine's set-up inside `Trainer.train` and the first step
    (bench/trainer_overhead.py). One comparison a step; added with or without the metrics callback."""

    def __init__(self) -> None:
        self.at: float | None = None

    def on_step_end(self, args, state, control, **kw):
        if self.at is None:
            self.at = time.perf_counter()
        return control
