"""Per-step measurements: FLOPs/MFU, peak memory per rank, and the metrics.jsonl writer (rank 0 only).

Names follow torchtitan's metrics set (loss, grad_norm, lr, tokens/s per device, TFLOPS, MFU, peak memory).
"""
from __future__ import annotations

import json
import math
import time
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from plan.catalog import model_from_config

GIB = 1024**3

def flops_per_token(cfg, seq_len: int, document_len: int | None = None) -> float:
    """Model FLOPs per trained token of a Hugging Face config, counted by the plan's catalog (the one copy the
    planner predicts with), so the measured TFLOPS and MFU sit beside the prediction on the same footing.
    Attention is counted over the document when sequences are packed (`document_len`), as the planner does."""
    if hasattr(cfg, "get_text_config"):  # multimodal wrappers keep the decoder's sizes in text_config
        cfg = cfg.get_text_config()
    values = cfg.to_dict() if hasattr(cfg, "to_dict") else vars(cfg)
    attention_len = seq_len if document_len is None else min(document_len, seq_len)
    return model_from_config(values).flops_per_token(attention_len)


def peak_tflops(spec) -> float | None:
    """Peak dense TFLOPS of one device the run uses (the plan's GPU, from the catalog or its custom object): None on
    CPU ranks (no meaningful MFU there)."""
    if not torch.cuda.is_available():
        return None
    return spec.gpu.peak_flops(spec.plan.training.dtype) / 1e12


class TensorMemoryTracker(TorchDispatchMode):
    """Bytes of live tensor storages on this rank, and their peak (CPU has no allocator statistics).

    Counts every storage produced by an op while active (activations, temporaries, transient gradients) plus the
    storages registered with `register` (parameters, gradients, optimizer states that exist before the step).
    A storage counts once, from its creation to the moment it is freed (a weak reference tells). Buffers that a
    library allocated before the step and never registers (e.g. DeepSpeed's communication buckets) are not seen.
    Unlike torch's MemTracker it installs no module hooks, so it composes with TiledMLP, activation checkpointing
    and ZeRO-3 (whose hooks run modules under autograd-disabled forwards).
    """

    def __init__(self):
        super().__init__()
        self._seen = WeakIdKeyDictionary()  # storage -> True while alive
        self._refs: dict[int, tuple] = {}  # id(weakref) -> (weakref, bytes, created during the step)
        self.current = self.peak = 0
        self.created = self.peak_created = 0

    def _add(self, st, created: bool) -> None:
        if st in self._seen:
            return
        n = st.nbytes()
        self._seen[st] = True
        ref = weakref.ref(st, self._gone)
        self._refs[id(ref)] = (ref, n, created)
        self.current += n
        if created:
            self.created += n

    def _gone(self, ref) -> None:
        entry = self._refs.pop(id(ref), None)
        if entry is not None:
            self.current -= entry[1]
            if entry[2]:
                self.created -= entry[1]

    def register(self, tensors) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._add(t.untyped_storage(), created=False)
        self.peak = max(self.peak, self.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in ((out,) if isinstance(out, torch.Tensor) else tree_flatten(out)[0]):  # most ops: one tensor
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                try:
                    self._add(t.untyped_storage(), created=True)
                except (RuntimeError, NotImplementedError):  # tensors without a storage (subclasses)
                    pass
        if self.current > self.peak:
            self.peak = self.current
        if self.created > self.peak_created:
            self.peak_created = self.created
        return out


def state_tensors(model, optimizer):
    """Parameters, their gradients and the optimizer's state and parameter tensors (fp32 masters under ZeRO)."""
    if model is not None:
        for p in model.parameters():
            yield p
            if p.grad is not None:
                yield p.grad
    if optimizer is not None:
        for g in optimizer.param_groups:
            yield from g["params"]
        for st in optimizer.state.values():
            yield from (v for v in st.values() if isinstance(v, torch.Tensor))


class MemoryMeter:
    """Peak memory of this rank over one optimizer step.

    CUDA: the caching allocator's max_memory_allocated / max_memory_reserved (reset each step), every step.
    CPU: `TensorMemoryTracker` (bytes of live tensor storages); there is no allocator cache on CPU, so
    peak_reserved is not reported; "activations" is the peak of the storages created during the step. The tracker
    sees every op of the step (a Python call each: about half the step of a small model), so on CPU it measures
    the first `FIRST` steps of each Trainer (a stage, or a resumed attempt: the optimizer states appear in the
    first) and every `every`-th step of the run; a step between carries the last measured figures, and
    `measured_step` (the record's `memory_step`) says which step they come from.
    """

    FIRST = 2

    def __init__(self, enabled: bool = True, every: int = 1):
        self.cuda = torch.cuda.is_available()
        self.enabled = enabled
        self.every = max(1, every)
        self.name = "cuda_allocator" if self.cuda else "cpu_tensor_tracker"
        self._tracker: TensorMemoryTracker | None = None
        self._model = self._optimizer = None
        self._begun = 0  # steps begun under this meter
        self._step: int | None = None  # the run's step being measured
        self._last: dict = {"allocated": None, "reserved": None, "activations": None}
        self.measured_step: int | None = None  # the step the last end_step's figures come from

    def track(self, model, optimizer) -> None:
        self._model, self._optimizer = model, optimizer

    def measures(self, step: int) -> bool:
        """Whether the run's `step` (1-based) is measured, as the `self._begun`-th step under this meter."""
        return self.cuda or self._begun < self.FIRST or step % self.every == 0

    def begin_step(self, step: int = 0) -> None:
        """Before the run's `step` (1-based)."""
        if not self.enabled:
            return
        measure = self.measures(step)
        self._begun += 1
        self._step = step if measure else None
        if not measure:
            return
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        tracker = TensorMemoryTracker()
        tracker.register(state_tensors(self._model, self._optimizer))
        tracker.__enter__()
        self._tracker = tracker

    def next_micro_batch(self) -> None:
        pass

    def end_step(self) -> dict:
        """{"allocated": bytes, "reserved": bytes|None, "activations": bytes|None} of this step's peak, or of the
        last measured step's (`measured_step`) when this one was not measured."""
        none = {"allocated": None, "reserved": None, "activations": None}
        if not self.enabled:
            return none
        step, self._step = self._step, None
        if step is None:
            return dict(self._last)
        if self.cuda:
            out = {"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved(),
                   "activations": None}
        else:
            t, self._tracker = self._tracker, None
            if t is None:
                return none
            t.__exit__(None, None, None)
            out = {"allocated": t.peak, "reserved": None, "activations": t.peak_created}
        self._last, self.measured_step = out, step
        return dict(out)

    def abort(self) -> None:
        if self._tracker is not None:
            try:
                self._tracker.__exit__(None, None, None)
            finally:
                self._tracker = None


class MetricsWriter:
    """Appends one JSON object per line to the attempt's metrics file and flushes it (rank 0 only)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", buffering=1)

    def write(self, record: dict) -> None:
        """Non-finite numbers (a diverged loss) become null: the line stays valid JSON."""
        self._f.write(json.dumps(_finite(record), allow_nan=False, default=float) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _finite(v):
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


class StepClock:
    """Wall seconds (perf_counter) and this process's CPU seconds (every thread: `time.process_time`) since `start`.
    CPU seconds well below the wall seconds say that the rank waited: for the other ranks in a collective, or for a
    core a shared host gave to other processes (bench/peer_alst.py compares two stacks by both)."""

    def __init__(self):
        self.start()

    def start(self) -> None:
        self.t0, self.c0 = time.perf_counter(), time.process_time()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def cpu(self) -> float:
        return time.process_time() - self.c0
