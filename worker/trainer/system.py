"""System figures of one rank, per step: the host's CPU use, this rank's CPU use and resident memory (psutil), and
its GPU's utilisation, memory in use, power and temperature (NVML, through nvidia-ml-py), as nvidia-smi shows them.

A sample is taken at most every `every_s` seconds; a step shorter than that reuses the previous sample, so the cost
per step stays bounded however short steps are (bench/system_metrics.py measures it). A figure this rank cannot
read is NaN, and the callback ships no point for it: on CPU ranks there is no GPU figure at all, and the run page
says "no GPU" instead of an empty chart.

The GPU is found by its UUID (torch.cuda.get_device_properties), which is NVML's own key whatever
CUDA_VISIBLE_DEVICES renumbers; the index is the fallback."""
from __future__ import annotations

import math
import time

import psutil

GIB = 1024**3
NAMES = ("host_cpu_percent", "cpu_percent", "rss_gib", "gpu_util_percent", "gpu_mem_used_gib", "gpu_power_w",
         "gpu_temp_c")
NAN = float("nan")


def _nvml_handle(device_index: int):
    """(pynvml, handle) of the CUDA device torch calls `device_index`, or None without NVML or a driver."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:  # not installed, no driver (a CPU machine), or NVML refused: no GPU figures
        return None
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:
        try:
            return pynvml, pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception:
            return None


class SystemSampler:
    def __init__(self, cuda_device: int | None, every_s: float = 1.0):
        self.every_s = every_s
        self.proc = psutil.Process()
        self.proc.cpu_percent(None)  # the first call starts the interval the next one measures
        psutil.cpu_percent(None)
        self.nvml = _nvml_handle(cuda_device) if cuda_device is not None else None
        self.last: list[float] = [NAN] * len(NAMES)
        self.at = -math.inf
        self.samples = 0

    def sample(self) -> list[float]:
        """The figures in NAMES order (NaN: not available here)."""
        now = time.monotonic()
        if now - self.at < self.every_s:
            return self.last
        self.at = now
        self.samples += 1
        with self.proc.oneshot():
            rank_cpu, rss = self.proc.cpu_percent(None), self.proc.memory_info().rss / GIB
        figures = [psutil.cpu_percent(None), rank_cpu, rss, NAN, NAN, NAN, NAN]
        if self.nvml is not None:
            pynvml, handle = self.nvml
            for i, read in enumerate((lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                                      lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used / GIB,
                                      lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,  # mW -> W
                                      lambda: pynvml.nvmlDeviceGetTemperature(handle, 0)), start=3):  # 0: GPU die
                try:
                    figures[i] = float(read())
                except Exception:  # a GPU without that sensor (power on some boards): that figure only
                    pass
        self.last = figures
        return figures
