"""worker/trainer/system.py: the per-rank host and GPU figures the step callback ships."""
from __future__ import annotations

import math
import sys
import types

import psutil

from worker.trainer.system import NAMES, SystemSampler


def test_a_cpu_rank_reads_its_host_figures_and_no_gpu_figure():
    s = SystemSampler(cuda_device=None, every_s=3600)
    first = s.sample()
    figures = dict(zip(NAMES, first, strict=True))
    assert 0.05 < figures["rss_gib"] < 64, figures  # this test process: torch is imported
    assert 0 <= figures["host_cpu_percent"] <= 100, figures
    assert figures["cpu_percent"] >= 0, figures
    assert all(math.isnan(figures[n]) for n in NAMES if n.startswith("gpu_")), figures
    assert s.sample() is first
    assert s.samples == 1  # within every_s: the previous sample, nothing read


def test_a_sample_is_taken_again_after_every_s():
    s = SystemSampler(cuda_device=None, every_s=0)
    s.sample()
    start = psutil.Process().cpu_times()
    while sum(psutil.Process().cpu_times()[:2]) - sum(start[:2]) < 0.05:  # 50 ms of CPU for the rank's figure
        sum(i * i for i in range(10_000))
    second = s.sample()
    assert s.samples == 2, second
    assert second[1] > 0, second


def test_the_gpu_figures_come_from_nvml_in_nvidia_smi_units(monkeypatch):
    """No GPU here: a stand-in pynvml answers as NVML does (power in mW, memory in bytes), so the units and the
    fall-back from the UUID to the index are checked; reading a real GPU is unproven until a GPU run."""
    calls = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlDeviceGetHandleByUUID=lambda uuid: (_ for _ in ()).throw(RuntimeError("no such uuid")),
        nvmlDeviceGetHandleByIndex=lambda i: ("gpu", i),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87, memory=40),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=60 * 1024**3, total=80 * 1024**3),
        nvmlDeviceGetPowerUsage=lambda h: 512_250,
        nvmlDeviceGetTemperature=lambda h, sensor: 64 if sensor == 0 else -1,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    s = SystemSampler(cuda_device=3, every_s=0)
    assert s.nvml == (fake, ("gpu", 3))
    assert calls == ["init"]
    figures = dict(zip(NAMES, s.sample(), strict=True))
    assert (figures["gpu_util_percent"], figures["gpu_mem_used_gib"], figures["gpu_power_w"],
            figures["gpu_temp_c"]) == (87.0, 60.0, 512.25, 64.0)
    fake.nvmlDeviceGetPowerUsage = lambda h: (_ for _ in ()).throw(RuntimeError("not supported"))
    figures = dict(zip(NAMES, s.sample(), strict=True))
    assert math.isnan(figures["gpu_power_w"])
    assert figures["gpu_temp_c"] == 64.0  # one missing sensor only
