"""`make gpu-check` (bench/gpu_check.py) and the offline package folder for a bare GPU machine
(scripts/gpu_wheels.sh): its flags, the incremental CSV, the row order; on a machine without CUDA the check says so
and succeeds, and fails without torch or with --require-cuda. `make gpu-rehearsal` runs the whole path."""
from __future__ import annotations

import csv
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _gpu_check():
    from bench import gpu_check

    return gpu_check


def test_without_torch_the_check_fails():
    # `python3 -I` here has no torch (the project's venv is not on its path): a missing torch is no pass
    probe = subprocess.run(["python3", "-I", "-c", "import torch"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(reason="the system python3 has torch")
    proc = subprocess.run(["python3", "-I", str(REPO / "bench" / "gpu_check.py"), "--cpu"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "torch cannot be imported" in proc.stderr, proc.stdout + proc.stderr


def test_require_cuda_without_cuda_fails():
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--require-cuda"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--require-cuda and no CUDA device" in proc.stderr, proc.stdout + proc.stderr


def test_rows_are_appended_one_by_one_under_one_header(tmp_path):
    g = _gpu_check()
    out = tmp_path / "gpu-x.csv"
    g.append_row(out, {"name": "a", "status": "ok", "measured_allocated_gib": 1.5, "not_a_column": 1})
    assert list(csv.DictReader(out.open()))[0]["measured_allocated_gib"] == "1.5"
    g.append_row(out, {"name": "b", "status": "oom"})
    lines = out.read_text().splitlines()
    assert lines[0].split(",") == g.FIELDS
    assert len(lines) == 3
    assert [r["status"] for r in csv.DictReader(out.open())] == ["ok", "oom"]


def test_a_row_appended_to_an_older_checks_file_stays_under_that_files_header(tmp_path):
    g = _gpu_check()
    out = tmp_path / "gpu-old.csv"
    old = [f for f in g.FIELDS if f not in ("forward_s", "backward_s", "optimizer_s", "metrics_overhead_s")]
    out.write_text(",".join(old) + "\n")
    g.append_row(out, {"name": "a", "status": "ok", "forward_s": 0.5, "note": "n", "plan": "{}"})
    (row,) = csv.DictReader(out.open())
    assert (row["name"], row["note"], row["plan"]) == ("a", "n", "{}")
    assert None not in row  # no value beyond the header's columns


def test_parts_filters_and_the_order_rows_run_in(tmp_path):
    g = _gpu_check()
    with pytest.raises(SystemExit):
        g.parse_args(["--parts", "suite,nope"])
    a = g.parse_args(["--cpu", "--out", str(tmp_path), "--parts", "suite,sweep", "--skip", "alst"])
    ck = g.Check(a, cuda=False)
    rows = g.select(g.rows_for(ck), a.part_set, a.only, a.skip)
    assert {r.part for r in rows} == {"suite", "sweep"}
    assert not any("alst" in r.name for r in rows)
    fits = [r.fits for r in rows]
    assert False in fits
    assert fits == sorted(fits, key=lambda f: f is False)  # predicted not to fit: last
    assert ck.csv.name.startswith("cpu-rehearsal-")  # never a gpu-*.csv: calibration does not read CPU rows
    only = g.select(g.rows_for(ck), set(g.PARTS), "^suite-resume$", None)
    assert [r.name for r in only] == ["suite-resume"]


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
                      ("pydantic", "PYDANTIC"), ("pyyaml", "PYYAML"), ("psutil", "PSUTIL"),
                      ("nvidia-ml-py", "NVML")):
        assert f"{name}=={pins[var]}" in declared, name
    assert subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu_wheels.sh")]).returncode == 0
    usage = subprocess.run(["bash", str(REPO / "scripts" / "gpu_wheels.sh")], capture_output=True, text=True)
    assert usage.returncode == 2
    assert "prepare DIR" in usage.stderr
