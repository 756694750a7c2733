"""What the window's kernel benches share (bench/sdpa_backends.py, bench/gemm_tflops.py, bench/plain_loop.py): the
device and dtype, the model shape they measure (the ~1B Llama on CUDA, the rehearsal's tiny model on CPU), a timer
that waits for the device, the peak FLOP/s they divide by, and the JSON they write."""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu_models import CPU_MODEL, LLAMA_1B  # noqa: E402


class Bench:
    def __init__(self, cpu: bool):
        import torch

        self.torch = torch
        self.cuda = torch.cuda.is_available() and not cpu
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        # CUDA: the trainer's bf16; CPU (make gpu-rehearsal): fp32, which every CPU kernel takes
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.model_name, self.config = ("llama-1b", LLAMA_1B) if self.cuda else ("tiny", CPU_MODEL)
        self.seq_len = 16384 if self.cuda else 512

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def once(self, fn: Callable[[], object]) -> float:
        """Seconds of one call, the device's work included."""
        self.sync()
        t = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t

    def repeat(self, fn: Callable[[], object], *, min_s: float, max_reps: int) -> float:
        """Median seconds per call over repeated calls (at least 3, until min_s or max_reps)."""
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < 3 or (time.perf_counter() - start < min_s and len(times) < max_reps):
            times.append(self.once(fn))
        return sorted(times)[len(times) // 2]

    def peak_flops(self) -> float | None:
        """The catalog's dense peak for this device and dtype (plan/catalog.py GpuSpec.peak_flops); None on CPU."""
        if not self.cuda:
            return None
        from bench.gpu_check_report import catalog_gpu
        from plan.catalog import GpuSpec, gpus

        gpu = catalog_gpu(self.torch.cuda.get_device_name(0))
        spec = gpus()[gpu] if isinstance(gpu, str) else GpuSpec(**gpu)
        return spec.peak_flops("bf16")

    def header(self) -> dict:
        t = self.torch
        return {"device": t.cuda.get_device_name(0) if self.cuda else "cpu", "torch": t.__version__,
                "cuda": t.version.cuda, "cudnn": t.backends.cudnn.version() if self.cuda else None,
                "dtype": str(self.dtype).removeprefix("torch."), "model": self.model_name}


def model_spec(config: dict):
    from plan.catalog import model_from_config

    return model_from_config(dict(config))


def write_json(path: Path | None, out: dict) -> None:
    text = json.dumps(out, indent=1)
    print(text, flush=True)
    if path is not None:
        path.write_text(text + "\n")
