"""The GPU window: one call that tells the stack from the physics, everything it measured tarred into one file.

`bash scripts/gpu_wheels.sh window DIR --out $OUT --budget-s 560` installs (its seconds count: --t0) and runs this.
CUDA rows only, no offload rows (so no DeepSpeedCPUAdam build). The parts, in the order they run:

  ulysses-sp2      the check's Ulysses SP=2 row, both ranks on one GPU, against one rank (bench/gpu_check_run.py)
  smi              `nvidia-smi -q -d CLOCK,POWER,PERFORMANCE` and the versions (torch, CUDA, cuDNN, driver, ours);
                   clocks, power, temperature and throttle reasons are sampled at 1 Hz from the window's start to
                   its end (telemetry.csv) under every part
  sdpa             bench/sdpa_backends.py: the backend torch picks for the ~1B's 16K GQA shape and a 3,001-token
                   document, forward+backward TFLOPS per backend, first and second call of 5 new lengths
  gemm             bench/gemm_tflops.py: bf16 GEMM TFLOPS at the ~1B's shapes, sustained 10 s
  plain-loop       bench/plain_loop.py: the ~1B at 16K in a plain PyTorch loop, 4 steps and a profiled one
  trainer-*        `ulab train` rows of 6 steps (5 measured after the first), every step's time and phases kept
                   (*.steps.jsonl): the ~1B at 16K (ZeRO-3, checkpointing; plain, then TiledMLP and the tiled
                   loss), each recording the caching allocator's trace from its start (alloc_row: the replay in
                   alloc-<row>.txt, the snapshots in a tar of their own); the ~150M ZeRO-2 at 8K on one-document
                   rows and on the 3,000-byte documents
  sdpa-cudnn-off   the picks again under TORCH_CUDNN_SDPA_PREFERRED=0, the switch the cudnn-off rows use
  trainer-*-cudnn-off  the ~150M's two rows with cuDNN attention off
  peer             bench/peer_alst.py: ulab train beside Accelerate's ALST example, SP=2 on the one GPU, one pair
  ulysses-sp2-zero3  the check's second Ulysses row (GPU only)

Every part has planned seconds (PLANNED: GPU figures from the first window's measured rows where one exists, else
estimated and marked so; CPU figures from `make gpu-rehearsal`). They are printed first; a part starts only when its
planned seconds fit in what is left of --budget-s (less RESERVE_S for the tar), else it is recorded as
`skipped (time budget)`, and every part's subprocess is cut at twice its plan (CPU: 4x, CUT_FACTOR) or the budget's
end, whichever comes first. A CUDA-only figure on CPU is recorded as "skipped: no CUDA". The window's folder lives
under --out while it runs (a killed call still returns what it wrote); at the end it becomes
OUT/window-<device>-<date>.tar.gz.

Usage: python bench/gpu_check_window.py [--cpu] --out DIR [--budget-s 560] [--t0 UNIX] [--skip REGEX] [--list]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu_check_rows import SWEEP_FEATURES, Row, rows_for  # noqa: E402
from bench.gpu_models import CPU_MODEL, LLAMA_1B, SUITE_MODEL  # noqa: E402

RESERVE_S = 15.0  # the tar, the summary and the sampler's stop, after the last part
# a part's process is cut at this many times its plan (or at the budget's end): the GPU's plans are tight; the
# rehearsal's CPU cores are shared, and one row there ran 2x its plan while other work ran
CUT_FACTOR = {True: 2.0, False: 4.0}
NO_CUDA = "skipped: no CUDA"
CUDNN_OFF = {"TORCH_CUDNN_SDPA_PREFERRED": "0"}  # torch's switch: cuDNN attention no longer first in SDPA's order
TRAINER_STEPS = 6  # the first carries warm-up: 5 measured
# the device tool brings back files of at most 16 MiB: the allocator snapshots' tar stays under it
SNAPSHOT_TAR_MAX = 15 * 2 ** 20
# nvidia-smi's 1 Hz sample; throttle reasons as the bit mask (clocks_event_reasons in newer drivers)
SMI_FIELDS = ("timestamp,clocks.sm,clocks.mem,clocks.max.sm,power.draw,power.limit,temperature.gpu,utilization.gpu,"
              "memory.used,{reasons}")
REASONS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


@dataclass
class Part:
    name: str
    planned_gpu_s: float
    planned_cpu_s: float
    run: Callable[[], str]  # returns the part's status
    source: str  # where the GPU plan comes from
    planned_s: float = 0.0
    result: dict = field(default_factory=dict)


class Window:
    def __init__(self, a: argparse.Namespace, cuda: bool):
        import torch

        self.a, self.cuda, self.torch = a, cuda, torch
        self.t0 = a.t0 if a.t0 is not None else time.time()
        name = torch.cuda.get_device_name(0) if cuda else "cpu-rehearsal"
        slug = "".join(c if c.isalnum() else "-" for c in name).strip("-").lower()
        self.dir = Path(a.out) / f"window-{slug}-{datetime.date.today().isoformat()}"
        self.lines: list[str] = []  # what is said before the folder exists (the plan), written to its log then
        self.log = None
        self.sampler: subprocess.Popen | None = None
        self.check = None
        self.plan: list[Part] = []
        self.row_timeout = 240.0

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)
        if self.log is not None:
            self.log.write(text + "\n")
            self.log.flush()

    @property
    def left_s(self) -> float:
        return self.a.budget_s - RESERVE_S - (time.time() - self.t0)

    # --- the parts' runners -------------------------------------------------------------------------------------
    def bench(self, name: str, script: str, args: list[str], planned: float, env: dict | None = None) -> str:
        """A kernel bench in its own process (its device memory freed after it; `--cpu` off CUDA): OUT/<name>.json
        and .log."""
        return self.script(name, script, [*args, *([] if self.cuda else ["--cpu"])], planned, env)

    def script(self, name: str, script: str, args: list[str], planned: float, env: dict | None = None) -> str:
        cmd = [sys.executable, str(ROOT / "bench" / script), "--json", str(self.dir / f"{name}.json"), *args]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env,
                                  timeout=max(5.0, min(CUT_FACTOR[self.cuda] * planned, self.left_s)))
            code, out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            code, out = 124, f"timed out after {e.timeout:.0f} s"
        (self.dir / f"{name}.log").write_text(out)
        if code:
            self.say("  | " + "\n  | ".join(out.strip().splitlines()[-15:]))
        return "ok" if code == 0 else ("timeout" if code == 124 else f"exit {code}")

    def smi(self) -> str:
        versions = self.versions()
        (self.dir / "versions.json").write_text(json.dumps(versions, indent=1) + "\n")
        self.say("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
        if not self.cuda or shutil.which("nvidia-smi") is None:
            (self.dir / "nvidia-smi-q.txt").write_text(NO_CUDA + "\n")
            return NO_CUDA
        out = subprocess.run(["nvidia-smi", "-q", "-d", "CLOCK,POWER,PERFORMANCE"], capture_output=True, text=True,
                             timeout=30)
        (self.dir / "nvidia-smi-q.txt").write_text(out.stdout + out.stderr)
        return "ok" if out.returncode == 0 else f"exit {out.returncode}"

    def versions(self) -> dict:
        import importlib.metadata as md
        import platform

        t = self.torch
        v: dict = {"python": platform.python_version(), "torch": t.__version__, "cuda": t.version.cuda,
                   "cudnn": t.backends.cudnn.version() if self.cuda else NO_CUDA}
        for pkg in ("triton", "transformers", "accelerate", "deepspeed", "liger-kernel", "flash-attn"):
            try:
                v[pkg] = md.version(pkg)
            except md.PackageNotFoundError:
                v[pkg] = "missing"
        if self.cuda and shutil.which("nvidia-smi"):
            v["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         capture_output=True, text=True).stdout.strip()
        return v

    def start_sampler(self) -> None:
        """nvidia-smi at 1 Hz into telemetry.csv for the whole window (the throttle-reason field has two names)."""
        path = self.dir / "telemetry.csv"
        if not self.cuda or shutil.which("nvidia-smi") is None:
            path.write_text(NO_CUDA + "\n")
            return
        for reasons in REASONS:
            query = SMI_FIELDS.format(reasons=reasons)
            probe = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv", "-i", "0"],
                                   capture_output=True, text=True)
            if probe.returncode == 0:
                self.sampler = subprocess.Popen(["nvidia-smi", f"--query-gpu={query}", "--format=csv", "-i", "0",
                                                 "-l", "1"], stdout=path.open("w"), stderr=subprocess.STDOUT)
                return
        path.write_text(f"nvidia-smi refused both throttle-reason fields: {probe.stdout}{probe.stderr}")

    def trainer_row(self, r: Row) -> str:
        from plan import estimate

        ck = self.checker()
        r.estimate = estimate(ck.plan(r))
        ck.a.run_timeout_s = self.row_timeout
        before = len(ck.failures)
        ck.run_row(r)
        return "ok" if len(ck.failures) == before else "; ".join(ck.failures[before:])[:300]

    def alloc_row(self, r: Row) -> str:
        """A trainer row whose processes record the caching allocator's trace from their start
        (bench/alloc_history/sitecustomize.py: the model's build and DeepSpeed's initialisation before the steps,
        each rank's snapshot at its exit), replayed here with bench/allocator_replay.py's rules against the reserved
        peak the real allocator reached (alloc-<row>.txt). The snapshots themselves go into a tar of their own
        (finish): the window's tar stays small. On CPU the recording is off (CUDA only) and the row runs as any."""
        alloc = self.dir / "alloc" / r.name
        r.env = {**r.env, "ULAB_ALLOC_HISTORY": str(alloc),
                 "PYTHONPATH": os.pathsep.join([str(ROOT / "bench" / "alloc_history"), str(ROOT),
                                                os.environ.get("PYTHONPATH", "")])}
        status = self.trainer_row(r)
        self.replay_snapshots(r.name, alloc)
        return status

    def replay_snapshots(self, name: str, alloc: Path) -> None:
        """bench/allocator_replay.py --snapshot over the row's snapshots, its output in alloc-<row>.txt."""
        snapshots = sorted(alloc.glob("*.pickle"))
        report = self.dir / f"alloc-{name}.txt"
        if not snapshots:
            report.write_text("no allocator snapshot: " + ("none was written" if self.cuda else NO_CUDA) + "\n")
            return
        try:
            proc = subprocess.run([sys.executable, str(ROOT / "bench" / "allocator_replay.py"),
                                   *[a for p in snapshots for a in ("--snapshot", str(p))]],
                                  capture_output=True, text=True, cwd=ROOT, timeout=max(5.0, min(60.0, self.left_s)),
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
            report.write_text(proc.stdout + proc.stderr)
        except subprocess.TimeoutExpired:
            report.write_text("the replay timed out; the snapshots are in the alloc tar\n")

    def checker(self):
        """The check's runner (bench/gpu_check_run.py Check): its CSV and steps file in the window's folder."""
        if self.check is None:
            from bench.gpu_check_run import Check

            ns = argparse.Namespace(out=str(self.dir), budget_s=self.a.budget_s - RESERVE_S, t0=self.t0,
                                    min_row_s=0.0, run_timeout_s=240.0)
            self.check = Check(ns, self.cuda)
        return self.check

    def ulysses(self, r: Row) -> str:
        return self.trainer_row(r)

    def peer(self, planned: float) -> str:
        if self.cuda:
            args = ["--cuda", "--seq-len", "8192", "--model", json.dumps(SUITE_MODEL)]
        else:
            args = ["--seq-len", "256"]
        return self.script("peer", "peer_alst.py", [*args, "--pairs", "1", "--steps", str(TRAINER_STEPS),
                                                    "--timeout", str(planned)], planned)

    # --- the plan -----------------------------------------------------------------------------------------------
    def parts(self) -> list[Part]:
        cuda = self.cuda
        first = "the first window (one H100): suite rows 25-36 s each, a row here is two of them"
        ulysses = [Part(r.name, 75, 150, lambda r=r: self.ulysses(r), first) for r in self.ulysses_rows()]
        out, later = ulysses[:1], ulysses[1:]  # the ZeRO-3 one last
        cudnn_off = Part("sdpa-cudnn-off", 15, 45, lambda: self.bench(
            "sdpa-cudnn-off", "sdpa_backends.py", ["--picks-only"], self.planned("sdpa-cudnn-off"), CUDNN_OFF),
            "estimate (unmeasured on a GPU)")
        out += [
            Part("smi", 5, 5, self.smi, "estimate"),
            Part("sdpa", 40, 60, lambda: self.bench("sdpa", "sdpa_backends.py", [], self.planned("sdpa")),
                 "estimate (unmeasured on a GPU)"),
            Part("gemm", 25, 20, lambda: self.bench("gemm", "gemm_tflops.py", [], self.planned("gemm")),
                 "10 s sustained + start (unmeasured on a GPU)"),
            Part("plain-loop", 60, 120, lambda: self.bench("plain-loop", "plain_loop.py", [],
                                                          self.planned("plain-loop")),
                 "estimate (unmeasured on a GPU)"),
        ]
        big, big_seq = (("llama-1b", LLAMA_1B), 16384) if cuda else (("tiny", CPU_MODEL), 512)
        small, small_seq = (("suite-150m", SUITE_MODEL), 8192) if cuda else (("tiny", CPU_MODEL), 256)
        doc = 3000 if cuda else 600

        def big_row(f: str) -> Row:
            return Row("window", f"trainer-{big[0]}-{f}-{big_seq}", big[0], big[1], big_seq, f, SWEEP_FEATURES[f],
                       TRAINER_STEPS, one_document=True)

        def small_row(one: bool, off: bool) -> Row:
            name = f"trainer-{small[0]}-{'one-document' if one else f'documents-{doc}'}{'-cudnn-off' if off else ''}"
            return Row("window", name, small[0], small[1], small_seq, "zero2" + (" cudnn off" if off else ""), {},
                       TRAINER_STEPS, one_document=one, env=CUDNN_OFF if off else {})

        sweep = ("the first window: ~1B sweep rows at 16K 84-94 s with 2 steps; 4 more at ~1.8 s (its 13% MFU); "
                 "an estimate")
        suite = "the first window: suite rows 25-36 s with 4 steps"
        # the ~1B rows record the caching allocator's trace of the whole run (alloc_row): first, with the
        # one-document and documents rows of the ~150M; the cuDNN-off rows, the peer and the second Ulysses row after
        big = [big_row("plain"), big_row("tiled")]
        out += [Part(r.name, 100, 150, lambda r=r: self.alloc_row(r), sweep) for r in big]
        out += [Part(r.name, 40, 150, lambda r=r: self.trainer_row(r), suite)
                for r in (small_row(True, False), small_row(False, False))]
        out.append(cudnn_off)
        out += [Part(r.name, 40, 150, lambda r=r: self.trainer_row(r), suite)
                for r in (small_row(False, True), small_row(True, True))]
        out.append(Part("peer", 80, 300, lambda: self.peer(self.planned("peer")),
                        "estimate: two SP=2 launches of the ~150M at 8K (unmeasured on a GPU)"))
        out += later
        for p in out:
            p.planned_s = p.planned_gpu_s if cuda else p.planned_cpu_s
        return [p for p in out if not (self.a.skip and re.search(self.a.skip, p.name))]

    def ulysses_rows(self) -> list[Row]:
        return [r for r in rows_for(self.checker()) if r.part == "ulysses"]

    def planned(self, name: str) -> float:
        return next(p.planned_s for p in self.plan if p.name == name)

    def run(self) -> int:
        self.plan = self.parts()
        spent = time.time() - self.t0
        total = sum(p.planned_s for p in self.plan)
        self.say(f"window on {'CUDA' if self.cuda else 'CPU (rehearsal)'}: budget {self.a.budget_s:.0f} s, "
                 f"{spent:.0f} s spent before the first part (the install), {RESERVE_S:.0f} s kept for the tar; "
                 f"planned {total:.0f} s in {len(self.plan)} parts")
        at = spent
        for p in self.plan:
            at += p.planned_s
            fits = "fits" if at <= self.a.budget_s - RESERVE_S else "past the budget unless earlier parts end early"
            source = p.source if self.cuda else "make gpu-rehearsal"
            self.say(f"  {p.name:<44} {p.planned_s:5.0f} s  (by {at:4.0f} s: {fits}; plan from {source})")
        if self.a.list:
            shutil.rmtree(self.checker().work, ignore_errors=True)
            return 0
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = (self.dir / "window.log").open("a")
        self.log.write("\n".join(self.lines) + "\n")
        if self.a.install_log is not None and self.a.install_log.exists():
            shutil.copy(self.a.install_log, self.dir / "install.log")
        self.start_sampler()
        try:
            for p in self.plan:
                self.run_part(p)
        finally:  # the tar is written whatever happened: it is all the window brings back
            code = self.finish()
        return code

    def run_part(self, p: Part) -> None:
        left = self.left_s
        if p.planned_s > left:
            p.result = {"status": "skipped (time budget)", "planned_s": p.planned_s, "left_s": round(left)}
            self.say(f"== {p.name}: skipped (time budget): planned {p.planned_s:.0f} s, {left:.0f} s left")
            return
        self.row_timeout = max(10.0, min(CUT_FACTOR[self.cuda] * p.planned_s, left))
        self.say(f"== {p.name} (planned {p.planned_s:.0f} s, {left:.0f} s left)")
        t = time.time()
        try:
            status = p.run()
        except Exception as e:  # one part's crash is recorded; the window goes on
            status = f"error: {type(e).__name__}: {e}"[:300]
        p.result = {"status": status, "planned_s": p.planned_s, "seconds": round(time.time() - t, 1)}
        self.say(f"   {p.name}: {status} in {p.result['seconds']:.0f} s (planned {p.planned_s:.0f})")

    def finish(self) -> int:
        if self.sampler is not None:
            self.sampler.terminate()
            self.sampler.wait(timeout=10)
        if self.check is not None:
            shutil.rmtree(self.check.work, ignore_errors=True)
        self.tar_snapshots()
        elapsed = time.time() - self.t0
        summary = {"budget_s": self.a.budget_s, "elapsed_s": round(elapsed, 1), "cuda": self.cuda,
                   "parts": {p.name: p.result or {"status": "not reached", "planned_s": p.planned_s}
                             for p in self.plan}}
        (self.dir / "window.json").write_text(json.dumps(summary, indent=1) + "\n")
        ran = sum(1 for p in self.plan if p.result.get("seconds") is not None)
        skipped = sum(1 for p in self.plan if p.result.get("status", "").startswith("skipped (time"))
        failed = [p.name for p in self.plan if p.result.get("seconds") is not None
                  and p.result["status"] not in ("ok", NO_CUDA)]
        self.say(f"window: {elapsed:.0f} s of the {self.a.budget_s:.0f} s budget; {ran} parts ran, {skipped} skipped "
                 f"for time, {len(failed)} not ok{': ' + ', '.join(failed) if failed else ''}")
        if self.log is not None:
            self.log.close()
        tar = self.dir.parent / f"{self.dir.name}.tar.gz"
        with tarfile.open(tar, "w:gz") as f:
            f.add(self.dir, arcname=self.dir.name)
        shutil.rmtree(self.dir)
        print(f"window: {tar} ({tar.stat().st_size / 1024:.0f} KiB); {time.time() - self.t0:.0f} s", flush=True)
        return 1 if failed or elapsed > self.a.budget_s else 0

    def tar_snapshots(self) -> None:
        """The allocator snapshots (alloc_row) into OUT/alloc-<device>-<date>.tar.gz, a file of their own that may
        be left out without losing the window's; dropped (and said so) past SNAPSHOT_TAR_MAX."""
        alloc = self.dir / "alloc"
        if not alloc.is_dir():
            return
        if any(alloc.rglob("*.pickle")):
            tar = self.dir.parent / f"alloc-{self.dir.name.removeprefix('window-')}.tar.gz"
            with tarfile.open(tar, "w:gz") as f:
                f.add(alloc, arcname=tar.name.removesuffix(".tar.gz"))
            size = tar.stat().st_size
            if size > SNAPSHOT_TAR_MAX:
                tar.unlink()
                self.say(f"window: the allocator snapshots took {size / 2 ** 20:.1f} MiB compressed, past "
                         f"{SNAPSHOT_TAR_MAX / 2 ** 20:.0f} MiB: left out (their replays are in alloc-*.txt)")
            else:
                self.say(f"window: allocator snapshots in {tar.name} ({size / 2 ** 20:.1f} MiB)")
        shutil.rmtree(alloc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the folder the one tar.gz lands in ($OUT)")
    ap.add_argument("--cpu", action="store_true", help="on CPU ranks, tiny sizes (make gpu-rehearsal)")
    ap.add_argument("--budget-s", type=float, default=560.0)
    ap.add_argument("--t0", type=float, default=None, help="unix time the budget counts from (default: now)")
    ap.add_argument("--skip", default=None, help="leave out parts whose name matches this regex")
    ap.add_argument("--install-log", type=Path, default=None, help="the install's output, kept in the tar")
    ap.add_argument("--list", action="store_true", help="print the parts and their planned seconds, run nothing")
    a = ap.parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print(f"error: torch cannot be imported by {sys.executable} ({e})", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if not cuda and not a.cpu:
        print("error: no CUDA device (use --cpu for the rehearsal)", file=sys.stderr)
        return 2
    return Window(a, cuda and not a.cpu).run()


if __name__ == "__main__":
    sys.exit(main())
