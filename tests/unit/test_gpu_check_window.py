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
    assert names == ["ulysses-sp2", "smi", "sdpa", "gemm", "plain-loop", "trainer-tiny-plain-512",
                     "trainer-tiny-tiled-512", "trainer-tiny-one-document", "trainer-tiny-documents-600",
                     "sdpa-cudnn-off", "trainer-tiny-documents-600-cudnn-off", "trainer-tiny-one-document-cudnn-off",
                     "peer"], proc.stdout
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


def a_snapshot() -> dict:
    """A snapshot as torch.cuda.memory._dump_snapshot writes it (the fields allocator_replay reads): one 20 MiB
    segment, two 2 MiB blocks handed out and freed, the second reusing the first's space."""
    mib = 2 ** 20
    trace = [{"action": "segment_alloc", "addr": 0, "size": 20 * mib, "stream": 0},
             {"action": "alloc", "addr": 0, "size": 2 * mib, "stream": 0},
             {"action": "free_completed", "addr": 0, "size": 2 * mib, "stream": 0},
             {"action": "alloc", "addr": 0, "size": 2 * mib, "stream": 0},
             {"action": "free_completed", "addr": 0, "size": 2 * mib, "stream": 0}]
    return {"segments": [], "device_traces": [trace]}


def window_in(tmp_path):
    import argparse

    sys.path.insert(0, str(REPO))
    from bench.gpu_check_window import Window

    a = argparse.Namespace(out=str(tmp_path), budget_s=600.0, t0=None, skip=None, install_log=None, list=False)
    w = Window(a, cuda=False)
    w.dir.mkdir(parents=True)
    return w


def test_a_rows_allocator_snapshots_are_replayed_and_come_back_in_a_tar_of_their_own(tmp_path):
    import pickle

    w = window_in(tmp_path)
    alloc = w.dir / "alloc" / "trainer-llama-1b-plain-16384"
    alloc.mkdir(parents=True)
    (alloc / "4242.pickle").write_bytes(pickle.dumps(a_snapshot()))
    w.replay_snapshots("trainer-llama-1b-plain-16384", alloc)
    report = (w.dir / "alloc-trainer-llama-1b-plain-16384.txt").read_text()
    assert "2 allocations; reserved peak recorded 0.02 GiB, replayed 0.02 GiB" in report, report
    w.tar_snapshots()
    assert not (w.dir / "alloc").exists()  # not in the window's own tar
    tars = [p for p in tmp_path.iterdir() if p.name.endswith(".tar.gz")]
    assert [p.name for p in tars] == [f"alloc-{w.dir.name.removeprefix('window-')}.tar.gz"]
    with tarfile.open(tars[0]) as tar:
        assert [Path(m.name).name for m in tar.getmembers() if m.isfile()] == ["4242.pickle"]


def test_snapshots_past_the_files_limit_are_left_out_and_said_so(tmp_path, monkeypatch):
    import os

    import bench.gpu_check_window as gw

    w = window_in(tmp_path)
    monkeypatch.setattr(gw, "SNAPSHOT_TAR_MAX", 1024)
    alloc = w.dir / "alloc" / "row"
    alloc.mkdir(parents=True)
    (alloc / "1.pickle").write_bytes(os.urandom(4096))  # incompressible: past 1 KiB compressed
    w.tar_snapshots()
    assert not any(p.name.endswith(".tar.gz") for p in tmp_path.iterdir())
    assert any("left out (their replays are in alloc-*.txt)" in line for line in w.lines)


def test_without_cuda_an_allocator_row_says_it_recorded_nothing(tmp_path):
    w = window_in(tmp_path)
    w.replay_snapshots("row", w.dir / "alloc" / "row")
    assert (w.dir / "alloc-row.txt").read_text() == "no allocator snapshot: skipped: no CUDA\n"


def test_the_allocator_history_is_recorded_only_in_torchruns_workers(tmp_path):
    """`ulab train` and torchrun never touch the device: the recording (which starts CUDA) is for the ranks alone,
    which torchrun marks with LOCAL_RANK."""
    import os

    probe = "import sys; print('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(REPO / "bench" / "alloc_history"), "ULAB_ALLOC_HISTORY": str(tmp_path)}
    env.pop("LOCAL_RANK", None)
    seen = {}
    for rank in (None, "0"):
        run_env = env if rank is None else {**env, "LOCAL_RANK": rank}
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=run_env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        seen[rank] = proc.stdout.strip()
    assert seen == {None: "False", "0": "True"}  # the launcher processes do not even import torch
