"""The GPU window (bench/gpu_check_window.py): its parts in the documented order with planned seconds, a part that
would overrun the budget recorded as skipped rather than run, CUDA-only figures recorded as "skipped: no CUDA" on
CPU, and everything in one tar under --out. `make gpu-rehearsal` runs every part of it on CPU."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WINDOW = REPO / "bench" / "gpu_check_window.py"


def test_the_plan_lists_every_part_in_order_with_its_planned_seconds(tmp_path):
    proc = subprocess.run([sys.executable, str(WINDOW), "--cpu", "--out", str(tmp_path), "--list"],
                          capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = re.findall(r"^  (\S+)\s+\d+ s  \(by\s+\d+ s: ", proc.stdout, re.M)
    assert names == ["ulysses-sp2", "smi", "sdpa", "sdpa-cudnn-off", "gemm", "plain-loop", "trainer-tiny-plain-512",
                     "trainer-tiny-one-document", "trainer-tiny-documents-600",
                     "trainer-tiny-documents-600-cudnn-off", "trainer-tiny-one-document-cudnn-off", "peer",
                     "trainer-tiny-tiled-512"], proc.stdout
    assert list(tmp_path.iterdir()) == []  # --list runs nothing and leaves nothing


def test_a_part_that_would_overrun_is_skipped_and_everything_comes_back_in_one_tar(tmp_path):
    # 15 s of budget past the tar's reserve: smi (planned 5 s) runs, gemm (planned 20 s) must not start
    install_log = tmp_path / "install.txt"
    install_log.write_text("installed\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(WINDOW), "--cpu", "--out", str(out), "--budget-s", "30", "--skip",
                           "ulysses|sdpa|plain|trainer|peer", "--install-log", str(install_log)],
                          capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    files = list(out.iterdir())
    assert len(files) == 1, files
    assert files[0].name.endswith(".tar.gz"), files
    with tarfile.open(files[0]) as tar:
        got = {Path(m.name).name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    summary = json.loads(got["window.json"])
    assert summary["parts"]["smi"]["status"] == "skipped: no CUDA"
    assert summary["parts"]["gemm"] == {"status": "skipped (time budget)", "planned_s": 20.0,
                                        "left_s": summary["parts"]["gemm"]["left_s"]}
    assert summary["parts"]["gemm"]["left_s"] < 20
    assert summary["elapsed_s"] <= 30
    assert "gemm.json" not in got  # never started
    assert got["telemetry.csv"].strip() == got["nvidia-smi-q.txt"].strip() == "skipped: no CUDA"
    assert json.loads(got["versions.json"])["cudnn"] == "skipped: no CUDA"
    assert got["install.log"] == "installed\n"
    assert "== gemm: skipped (time budget): planned 20 s" in got["window.log"]


def test_the_profile_counts_overlapping_kernels_once():
    from bench.plain_loop import busy_union

    assert busy_union([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    assert busy_union([]) == 0


def test_the_backend_bench_names_the_kernel_torch_picked_on_cpu(tmp_path):
    out = tmp_path / "sdpa.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "sdpa_backends.py"), "--cpu", "--picks-only",
                           "--json", str(out)], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    picks = json.loads(out.read_text())["picks"]
    # torch's CPU dispatch for a causal GQA call in fp32 is its blocked flash kernel (the profiler's aten op name)
    assert picks == {"tiny-512-gqa": "flash (cpu)", "document-301": "flash (cpu)"}


def test_one_document_rows_hold_a_document_for_every_step(tmp_path):
    # a 6-step row on one-document data trains on 6 rows: fewer documents left its last steps without a target
    import argparse
    import shutil

    from bench.gpu_check_rows import Row
    from bench.gpu_check_run import Check
    from bench.gpu_models import CPU_MODEL

    ck = Check(argparse.Namespace(out=str(tmp_path), t0=None, budget_s=60, min_row_s=0, run_timeout_s=60), False)
    try:
        for steps, gas in ((6, 1), (3, 2), (2, 1)):
            r = Row("window", "x", "tiny", CPU_MODEL, 256, "zero2", {}, steps=steps, gas=gas, one_document=True)
            docs = Path(ck.plan(r)["run"]["data"]["path"]).read_text().strip().split("\n\n")
            assert len(docs) >= steps * gas, (steps, gas, len(docs))
            assert {len(d) for d in docs} == {255}
    finally:
        shutil.rmtree(ck.work, ignore_errors=True)
