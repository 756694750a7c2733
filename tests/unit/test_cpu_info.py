"""worker/trainer/cpu_info.py: DeepSpeed's CPU Adam asks py-cpuinfo three times per rank, a Python subprocess each;
after `share_cpu_info()` the launcher asks once and its ranks not at all."""
from __future__ import annotations

import json
import os
import subprocess

import cpuinfo
import pytest

from worker.trainer.cpu_info import CPU_INFO_ENV, share_cpu_info


@pytest.fixture
def started(monkeypatch):
    """The subprocesses started meanwhile (py-cpuinfo runs `cpuinfo.py --json` in one), and the module restored."""
    monkeypatch.setattr(cpuinfo, "get_cpu_info", cpuinfo.get_cpu_info)  # undone after the test
    monkeypatch.delenv(CPU_INFO_ENV, raising=False)
    seen: list = []

    class Counted(subprocess.Popen):
        def __init__(self, args, *a, **kw):
            seen.append(args)
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", Counted)
    return seen


def deepspeed_cpu_adam_builder():
    from worker.trainer.train import import_deepspeed

    import_deepspeed()
    from deepspeed.ops.op_builder import CPUAdamBuilder

    return CPUAdamBuilder()


def test_without_it_each_question_of_deepspeed_starts_a_subprocess(started):
    builder = deepspeed_cpu_adam_builder()
    builder.cpu_arch()
    builder.simd_width()
    assert sum("--json" in map(str, args) for args in started) == 2


def test_the_launcher_asks_once_and_hands_the_answer_on(started):

    builder = deepspeed_cpu_adam_builder()
    reading = share_cpu_info()
    assert reading
    assert reading.get("arch")
    asked = len(started)
    assert asked == 1
    flags = (builder.cpu_arch(), builder.simd_width())
    cpuinfo.get_cpu_info()  # DeepSpeedCPUAdam's own question
    assert len(started) == asked  # answered from the reading
    assert json.loads(os.environ[CPU_INFO_ENV]) == reading  # what the launcher's ranks inherit
    assert flags[0] == "-march=native"


def test_a_rank_answers_from_the_environment_without_asking(started, monkeypatch):
    given = {"arch": "X86_64", "flags": ["avx2"], "brand_raw": "from the launcher"}
    monkeypatch.setenv(CPU_INFO_ENV, json.dumps(given))
    assert share_cpu_info() == given
    assert cpuinfo.get_cpu_info()["brand_raw"] == "from the launcher"
    builder = deepspeed_cpu_adam_builder()
    assert builder.simd_width() == "-D__AVX256__"  # the launcher's flags, not this machine's
    assert started == []


def test_an_empty_answer_is_not_kept(started, monkeypatch):
    monkeypatch.setattr(cpuinfo, "get_cpu_info", lambda: {})
    assert share_cpu_info() is None
    assert CPU_INFO_ENV not in os.environ
