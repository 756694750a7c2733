"""`make gpu-check` (bench/gpu_check.py) and the offline package folder for a bare GPU machine
(scripts/gpu_wheels.sh): on a machine without CUDA the check says so and succeeds."""
from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_without_cuda_make_gpu_check_skips_and_exits_0():
    proc = subprocess.run(["make", "-s", "gpu-check"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "no CUDA device: GPU check skipped"


def test_gpu_check_is_not_part_of_make_test():
    makefile = (REPO / "Makefile").read_text()
    test_rule = re.search(r"^test:(.*)$", makefile, re.MULTILINE).group(1)
    assert "gpu-check" not in test_rule


def test_the_wheel_folder_script_uses_the_projects_pins():
    script = (REPO / "scripts" / "gpu_wheels.sh").read_text()
    pins = dict(re.findall(r"^([A-Z_]+)=([0-9.]+)$", script, re.MULTILINE))
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["gpu"]
    for name, var in (("deepspeed", "DEEPSPEED"), ("transformers", "TRANSFORMERS"), ("liger-kernel", "LIGER"),
                      ("pydantic", "PYDANTIC"), ("pyyaml", "PYYAML")):
        assert f"{name}=={pins[var]}" in declared, name
    assert subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu_wheels.sh")]).returncode == 0
    usage = subprocess.run(["bash", str(REPO / "scripts" / "gpu_wheels.sh")], capture_output=True, text=True)
    assert usage.returncode == 2 and "prepare DIR" in usage.stderr
