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

    CUDA: the caching allocator's max_memory_allocated / max_memory_reserved (reset each step).
    CPU: `TensorMemoryTracker` (bytes of live tensor storages); there is no allocator cache on CPU, so
    peak_reserved is not reported; "activations" is the peak of the storages created during the step.
    """

    def __init__(self, enabled: bool = True):
        self.cuda = torch.cuda.is_available()
        self.enabled = enabled
        self.name = "cuda_allocator" if self.cuda else "cpu_tensor_tracker"
        self._tracker: TensorMemoryTracker | None = None
        self._model = self._optimizer = None

    def track(self, model, optimizer) -> None:
        self._model, self._optimizer = model, optimizer

    def begin_step(self) -> None:
        if not self.enabled:
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
        """{"allocated": bytes, "reserved": bytes|None, "activations": bytes|None} of this step's peak."""
        if not self.enabled:
            return {"allocated": None, "reserved": None, "activations": None}
        if self.cuda:
            return {"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved(),
                    "activations": None}
        t, self._tracker = self._tracker, None
        if t is None:
            return {"allocated": None, "reserved": None, "activations": None}
        t.__exit__(None, None, None)
        return {"allocated": t.peak, "reserved": None, "activations": t.peak_created}

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
    def __init__(self):
        self.t0 = time.perf_counter()

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0
