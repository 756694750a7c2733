"""What `ulab train` hands torchrun for a 2-rank plan: options every supported torch knows, and the ranks' save grace
in the environment. torch 2.11's torchrun has no `--shutdown-timeout` and exits 2 on it, which stopped both Ulysses
rows of the H100 check (bench/results/logs/gpu-h100-2026-11-27-check-2.log); this machine's torch 2.13 has it, so
only the recorded option list (tests/unit/test_plan_launch.py TORCHRUN_2_11_OPTIONS) catches it here."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

from plan.launch import SHUTDOWN_TIMEOUT_ENV, stop_grace_s
from tests.boundaries import ROOT
from tests.tiny import tiny_plan
from tests.unit.test_plan_launch import TORCHRUN_2_11_OPTIONS

# run_train in a child process (it takes the run directory's lock and tags the environment, as a launcher does),
# with Popen recording the torchrun it would start instead of starting it
RECORD_LAUNCH = """
import json, sys
from worker.trainer import launcher as cli
seen = {}
class Torchrun:
    def __init__(self, cmd, **kw):
        seen["cmd"], seen["env"] = cmd, {k: v for k, v in kw["env"].items() if k.startswith("TORCH")}
    def poll(self):
        return 0
    def wait(self, timeout=None):
        return 0
    def send_signal(self, signum):
        pass
cli.subprocess.Popen = Torchrun
code = cli.run_train(sys.argv[1], sys.argv[2], resume=False)
print(json.dumps({**seen, "code": code}))
"""


def record_launch(tmp_path, **env_extra: str) -> tuple[dict, dict]:
    """A 2-rank plan (run.stop_grace_s 77), and what its `run_train` hands Popen, with its exit code."""
    data = tmp_path / "docs.txt"
    data.write_text("A few words of text for the tiny tokenizer to pack into rows.\n" * 400)
    plan = {**tiny_plan(sp_size=2, seq_len=64), "run": {"steps": 1, "data": {"path": str(data)}, "stop_grace_s": 77}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", SHUTDOWN_TIMEOUT_ENV)} | env_extra
    out = subprocess.run([sys.executable, "-c", RECORD_LAUNCH, str(tmp_path / "plan.json"), str(tmp_path / "run")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return plan, json.loads(out.stdout.strip().splitlines()[-1])


def test_ulab_train_starts_torchrun_with_options_torch_2_11_knows_and_the_grace_in_its_environment(tmp_path):
    plan, seen = record_launch(tmp_path)
    assert seen["code"] == 0
    cmd = seen["cmd"]
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    options = {a for a in cmd[:cmd.index("worker.trainer.rank")] if a.startswith("-")}
    assert options <= TORCHRUN_2_11_OPTIONS, options - TORCHRUN_2_11_OPTIONS
    assert stop_grace_s(plan) == 77
    assert seen["env"][SHUTDOWN_TIMEOUT_ENV] == "77"


def test_the_launcher_starts_the_rank_module_even_inside_a_rank_environment(tmp_path):
    """`ulab train` is a launcher only: run where LOCAL_RANK and RANK are set (under a scheduler's or another
    torchrun's environment) it still starts torchrun, and torchrun starts the rank's entry point."""
    _, seen = record_launch(tmp_path, LOCAL_RANK="0", RANK="0")
    assert seen["code"] == 0
    cmd = seen["cmd"]
    assert cmd[cmd.index("-m", 3) + 1] == "worker.trainer.rank"


def test_the_launcher_module_holds_no_rank_code_path():
    """The launcher (launcher.py) never switches on the rank's environment, and reaches the training code only through
    the rank module's `train_rank`."""
    source = (ROOT / "worker" / "trainer" / "launcher.py").read_text()
    assert "LOCAL_RANK" not in source
    imports = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)]
    assert not [n.module for n in imports if n.module in ("train", "sp_trainer", "callbacks")]
    assert [a.name for n in imports if n.module == "rank" for a in n.names] == ["train_rank"]
