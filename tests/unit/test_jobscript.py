"""The Slurm job script (backend/executors/slurm/jobscript.py) and what `ulab job` reads from Slurm's environment
(worker/slurm_job.py), without a cluster: hostile values stay data, the #SBATCH lines are exactly what the run
asks for, SIGTERM reaches srun, and node lists expand as `scontrol show hostnames` expands them. A two-node job
cannot run on this one machine, so its script and rendezvous are checked here."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from backend.core.settings import Settings
from backend.executors.registry import executor_name
from backend.executors.slurm.jobscript import JobRequest, render
from backend.executors.slurm.submit import job_request, parse_scontrol
from backend.runs.models import Run
from plan.model import Plan
from tests.tiny import tiny_plan
from worker.slurm_job import expand_nodelist, rendezvous_env

HOSTILE = "x'; touch {m}; echo '$(touch {m})`touch {m}`\"$HOME\n;touch {m} #"


def request(**changes) -> JobRequest:
    base = dict(run_id=7, attempt=1, nodes=1, gpus_per_node=0, grace_s=40, plan=Path("/shared/run-7/plan.json"),
                ulab="/opt/ulab/bin/ulab")
    return JobRequest(**{**base, **changes})


def sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def stub_srun(bin_dir: Path, record: Path, on_term_exit: int | None = None) -> None:
    """An `srun` that writes its argument list as JSON (and, if asked, waits and exits on SIGTERM; the file
    `record`.ready says its handler is set)."""
    bin_dir.mkdir(exist_ok=True)
    ready = record.with_name(record.name + ".ready")
    wait = (f"import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit({on_term_exit}))\n"
            f"open({str(ready)!r}, 'w').close()\ntime.sleep(60)\n") if on_term_exit is not None else ""
    (bin_dir / "srun").write_text(f"#!{shutil.which('python3')}\nimport json, sys\n"
                                  f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n{wait}")
    (bin_dir / "srun").chmod(0o755)


def test_hostile_paths_reach_srun_as_single_arguments(tmp_path):
    marker = tmp_path / "pwned"
    plan = tmp_path / HOSTILE.format(m=marker) / "plan.json"
    ulab = str(tmp_path / ("ulab " + HOSTILE.format(m=marker)))
    script = render(request(plan=plan, ulab=ulab))
    (tmp_path / "job.sh").write_text(script)
    record = tmp_path / "argv.json"
    stub_srun(tmp_path / "bin", record)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    r = subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert json.loads(record.read_text()) == ["--kill-on-bad-exit=1", ulab, "job", "--plan", str(plan)]
    assert not marker.exists(), "a value of the script ran as a command"
    assert "touch" not in "\n".join(sbatch_lines(script))


def test_sbatch_lines_are_what_the_run_asks_for():
    assert sbatch_lines(render(request())) == [
        "#SBATCH --job-name=ulab-run-7", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
        "#SBATCH --signal=B:TERM@40", "#SBATCH --requeue", "#SBATCH --open-mode=append"]
    two_nodes = sbatch_lines(render(request(nodes=2, gpus_per_node=8, partition="gpu", account="lab-1", qos="high",
                                            time_limit="2-00:00:00")))
    assert two_nodes[1:8] == ["#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                              "#SBATCH --partition=gpu", "#SBATCH --account=lab-1", "#SBATCH --qos=high",
                              "#SBATCH --time=2-00:00:00"]
    assert not any("gpus" in line for line in sbatch_lines(render(request(gpus_per_node=0)))), \
        "a CPU partition without GRES gets no GPU request"


@pytest.mark.parametrize("field,value", [("partition", "gpu\n#SBATCH --uid=0"), ("account", "a b"),
                                         ("qos", "$(id)"), ("time_limit", "1:00; rm"), ("partition", "-x")])
def test_bad_slurm_values_are_refused_naming_the_field(field, value):
    name = "time" if field == "time_limit" else field
    with pytest.raises(ValueError, match=f"slurm {name}"):
        render(request(**{field: value}))


def test_numbers_must_be_whole_numbers():
    with pytest.raises(ValueError, match="nodes"):
        render(request(nodes="1; id"))  # type: ignore[arg-type]


def test_sigterm_to_the_script_reaches_srun_and_its_exit_code_is_the_jobs(tmp_path):
    """--signal=B:TERM@grace signals only the batch shell: its trap passes SIGTERM on to srun and waits for it."""
    (tmp_path / "job.sh").write_text(render(request(plan=tmp_path / "plan.json")))
    record = tmp_path / "argv.json"
    stub_srun(tmp_path / "bin", record, on_term_exit=75)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    proc = subprocess.Popen(["bash", str(tmp_path / "job.sh")], env=env)
    ready = record.with_name(record.name + ".ready")  # the stub has set its SIGTERM handler
    end = time.monotonic() + 20
    while not ready.exists():
        assert time.monotonic() < end, "the stub srun did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 75


CASES = ["vm", "gpu[01-03,07],login1", "a[1-2]-ib[1,3]", "node[009-011]", "x1,y[2-3],z"]


def scontrol_hostnames(nodelist: str, tmp_path: Path) -> list[str]:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\n")
    r = subprocess.run(["scontrol", "show", "hostnames", nodelist], env={**os.environ, "SLURM_CONF": str(conf)},
                       capture_output=True, text=True, timeout=30, check=True)
    return r.stdout.split()


@pytest.mark.parametrize("nodelist", CASES)
def test_node_lists_expand_as_scontrol_expands_them(nodelist, tmp_path):
    assert shutil.which("scontrol"), "scontrol is not installed (`make slurm`)"
    assert expand_nodelist(nodelist) == scontrol_hostnames(nodelist, tmp_path)


def test_two_node_job_meets_on_its_first_node():
    env = {"SLURM_JOB_ID": "4321", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]",
           "SLURM_NODEID": "1", "SLURM_RESTART_COUNT": "1"}
    assert rendezvous_env(env, run_id=9, port_base=29400) == {
        "ULAB_RDZV_ENDPOINT": "gpu07:29721", "ULAB_NODE_RANK": "1", "ULAB_RDZV_ID": "ulab-run9-job4321-restart1"}
    assert rendezvous_env({**env, "SLURM_JOB_NUM_NODES": "1"}, 9, 29400) == {}  # one node: torchrun standalone


def test_scontrol_lines_become_jobs():
    text = ("JobId=12 JobName=ulab-run-3 JobState=PENDING Reason=Priority Requeue=1 Restarts=0 ExitCode=0:0 "
            "NodeList=(null)\nJobId=13 JobName=ulab-run-4 JobState=FAILED Reason=NonZeroExitCode Restarts=2 "
            "ExitCode=3:0 NodeList=gpu[01-02]\n")
    jobs = parse_scontrol(text)
    assert (jobs["12"].state, jobs["12"].reason, jobs["12"].restarts) == ("PENDING", "Priority", 0)
    assert (jobs["13"].state, jobs["13"].exit_code, jobs["13"].restarts, jobs["13"].nodes) == \
        ("FAILED", 3, 2, "gpu[01-02]")


def test_the_executor_and_slurm_settings_are_chosen_per_gpu_queue(monkeypatch, tmp_path):
    spec = {**tiny_plan(sp_size=4, dp_size=4), "run": {"steps": 5, "data": {"path": str(tmp_path / "corpus.txt")}}}
    spec["hardware"].update(gpus_per_node=8, num_nodes=2)
    for key in [k for k in os.environ if k.startswith(("ULAB_EXECUTOR_", "ULAB_SLURM_"))]:
        monkeypatch.delenv(key)
    plan = Plan.model_validate(spec)
    assert executor_name(plan, Settings()) == "celery"
    monkeypatch.setenv("ULAB_EXECUTOR_GPU_H100_80GB", "slurm")
    assert executor_name(plan, Settings()) == "slurm"
    a100 = Plan.model_validate({**spec, "hardware": {**spec["hardware"], "gpu": "A100-80GB"}})
    assert executor_name(a100, Settings()) == "celery"
    monkeypatch.setenv("ULAB_EXECUTOR_GPU_H100_80GB", "kubernetes")
    with pytest.raises(ValueError, match="ULAB_EXECUTOR_GPU_H100_80GB"):
        executor_name(plan, Settings())
    monkeypatch.setenv("ULAB_SLURM_PARTITION", "any")
    monkeypatch.setenv("ULAB_SLURM_PARTITION_GPU_H100_80GB", "h100")
    monkeypatch.setenv("ULAB_SLURM_TIME_LIMIT", "1-00:00:00")
    run = Run(id=3, attempt=2, spec=spec, slurm_time_limit="30")
    req = job_request(run, Settings(), tmp_path / "plan.json")
    assert (req.nodes, req.gpus_per_node, req.partition, req.time_limit, req.attempt) == (2, 8, "h100", "30", 2)
    monkeypatch.setenv("ULAB_SLURM_GPUS", "false")
    assert job_request(run, Settings(), tmp_path / "plan.json").gpus_per_node == 0
