"""The planner's exports run as downloaded: the zip of a two-node CPU plan, unzipped where there is no
repository, with the trainer installed from a wheel this test builds, runs unedited: its torchrun lines (one per
"node", on this machine), its sbatch script on the real slurmctld/slurmd, and its DeepSpeed JSON / Accelerate YAML /
training_args.json in DeepSpeed's, Accelerate's and Transformers' own loaders. One Chromium click downloads the zip.

The venv the wheel goes into: `python -m venv --system-site-packages` from the project's venv would see the base
interpreter's packages, not the project venv's (torch, deepspeed, ... live there), and installing them again is
minutes and gigabytes. So the venv is bare, a .pth file puts the project venv's site-packages after its own, and the
wheel goes in as the exports say, with its `trainer` extra, but from no index: pip finds every requirement of the
extra already satisfied there (a pin that the installed versions do not meet fails the install). `plan` and `worker`
come from the wheel (asserted), every third-party package from the project venv. A .pth line only adds a path, so
the project's own editable install (a .pth inside that site-packages) stays out."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from tests.e2e.browser import chromium_page
from tests.e2e.test_dashboard_planner import _wait_valid
from tests.services import REPO
from tests.slurm_cluster import missing, slurm_cluster
from tests.tiny import tiny_plan
from worker.trainer.net import free_port

pytestmark = pytest.mark.slow
STEPS = 2
# sp 2 over two nodes of one rank each: every step is a Ulysses all-to-all between the "nodes"
PLAN = tiny_plan(sp_size=2, seq_len=256) | {"hardware": {"gpu": "H100-80GB", "gpus_per_node": 1, "num_nodes": 2}}


@pytest.fixture(scope="module")
def trainer_venv(tmp_path_factory) -> Path:
    """A venv with the project's wheel, built here from a copy of the sources (no checkout on the "cluster")."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("plan", "backend", "worker"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", src)
    shutil.copy(REPO / "README.md", src)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "dist"),
         str(src)])
    wheel = next((root / "dist").glob("ulysses_lab-*.whl"))
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    site = Path(run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]))
    (site / "project-venv.pth").write_text(sysconfig.get_path("purelib") + "\n")
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-index", "-q",
         f"{wheel}[trainer]"])  # plan/exports.py TRAINER_WHEEL_INSTALL, from no index
    # Accelerate is the project venv's (satisfied through the .pth), so pip wrote no `accelerate` command here: the
    # console script its install writes on a node (accelerate's entry point, accelerate_cli:main)
    launcher = venv / "bin" / "accelerate"
    launcher.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom accelerate.commands.accelerate_cli import main"
                        "\nsys.exit(main())\n")
    launcher.chmod(0o755)
    return venv


def run(cmd: list[str], **kw) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert proc.returncode == 0, f"{cmd}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc.stdout.strip()


def node_env(venv: Path, **extra: str) -> dict[str, str]:
    """A shell on a cluster node: the venv's python first on PATH, nothing of this repository on sys.path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "ULAB_"))}
    return {**env, "PATH": f"{venv / 'bin'}:{env['PATH']}", **extra}


def unzip(blob: bytes, where: Path) -> Path:
    where.mkdir(parents=True)
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        z.extractall(where)
    for name in where.glob("*.sh"):
        name.chmod(0o755)
    return where


@pytest.fixture(scope="module")
def exported(api, corpus) -> bytes:
    plan = PLAN | {"run": {"steps": STEPS, "checkpoint_every": 0, "learning_rate": 1e-3,
                           "data": {"path": str(corpus)}}}
    r = api.post("/api/estimate/export.zip", json=plan)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/zip"
    return r.content


def test_the_page_downloads_every_file_for_every_node_in_one_zip(api_server, tmp_path):
    with chromium_page(height=1600) as page:
        page.goto(f"{api_server}/#/planner")
        _wait_valid(page)
        page.fill("[data-testid=input-num_nodes]", "2")
        _wait_valid(page)
        # the example plan has no run section: the page asks for one, and plan.json carries it
        page.fill("[data-testid=export-steps]", "7")
        with page.expect_download() as info:
            page.click("[data-testid=download-zip]")
        assert info.value.suggested_filename == "ulysses-lab-plan.zip"
        blob = Path(info.value.path()).read_bytes()
    names = set(zipfile.ZipFile(io.BytesIO(blob)).namelist())
    assert {"plan.json", "deepspeed_config.json", "training_args.json", "ulab-job.sbatch", "README.txt",
            "launch_node0.sh", "launch_node1.sh", "accelerate_config_node0.yaml",
            "accelerate_config_node1.yaml"} <= names, names
    plan = json.loads(zipfile.ZipFile(io.BytesIO(blob)).read("plan.json"))
    assert plan["run"]["steps"] == 7
    assert plan["hardware"]["num_nodes"] == 2


def test_a_plan_without_a_run_section_has_no_zip(api):
    r = api.post("/api/estimate/export.zip", json=PLAN)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "run", r.text


def test_the_torchrun_lines_train_one_per_node_with_the_wheel(exported, trainer_venv, tmp_path):
    # the files unzipped once on a file system every node sees (the run directory must be shared, README.txt)
    d = unzip(exported, tmp_path / "unzipped")
    env = node_env(trainer_venv, MAIN_NODE_IP="127.0.0.1", MAIN_NODE_PORT=str(free_port()))
    where = run([str(trainer_venv / "bin" / "python"), "-c", "import plan, worker; print(worker.__file__)"],
                cwd=d, env=env)
    assert where.startswith(str(trainer_venv)), where  # the wheel's trainer, not this checkout
    procs = [subprocess.Popen(["bash", f"launch_node{n}.sh"], cwd=d, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for n in (0, 1)]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-4000:]
    lines = [json.loads(x) for f in (d / "runs" / "my-run").glob("metrics*.jsonl") for x in f.open()]
    assert sorted({x["step"] for x in lines}) == list(range(1, STEPS + 1)), lines[:3]


LOAD_DEEPSPEED = textwrap.dedent("""
    import json, sys
    import deepspeed.comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig
    dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    c = DeepSpeedConfig(json.load(open("deepspeed_config.json")))  # no mpu: a user's own script
    if dist.get_rank() == 0:
        print(json.dumps({"world": dist.get_world_size(), "dp": c.world_size, "train_batch_size": c.train_batch_size}))
""")


def test_the_deepspeed_json_yaml_and_training_args_load_in_their_libraries(exported, trainer_venv, tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DeepSpeedPlugin
    from transformers import TrainingArguments

    d = unzip(exported, tmp_path / "files")
    (d / "load_ds.py").write_text(LOAD_DEEPSPEED)
    out = run([str(trainer_venv / "bin" / "python"), "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", "load_ds.py"], cwd=d, env=node_env(trainer_venv))
    # the plan's world (2 ranks), sp 2: DeepSpeed's data-parallel world is 1, and its batch assertion holds
    assert json.loads(out.splitlines()[-1]) == {"world": 2, "dp": 1, "train_batch_size": 1}
    for n in (0, 1):
        config = load_config_from_file(str(d / f"accelerate_config_node{n}.yaml"))
        assert (config.machine_rank, config.num_machines, config.num_processes) == (n, 2, 2)
        ds_file = config.deepspeed_config["deepspeed_config_file"]
        assert set(config.deepspeed_config) <= {"deepspeed_config_file", "zero3_init_flag",
                                                "deepspeed_multinode_launcher"}  # one copy: the JSON
        os.environ["ACCELERATE_CONFIG_DS_FIELDS"] = ",".join(config.deepspeed_config)  # as `accelerate launch` does
        try:
            plugin = DeepSpeedPlugin(hf_ds_config=str(d / ds_file))
        finally:
            del os.environ["ACCELERATE_CONFIG_DS_FIELDS"]
        assert plugin.deepspeed_config["sequence_parallel_size"] == 2
        assert plugin.zero_stage == 2
    args = json.loads((d / "training_args.json").read_text())
    fields = {k: v for k, v in args["training_arguments"].items() if k != "deepspeed"} | {"use_cpu": True}
    ta = TrainingArguments(**fields)
    assert (ta.max_steps, ta.learning_rate) == (STEPS, 1e-3)
    assert args["training_arguments"]["deepspeed"] == ds_file
    assert args["parallelism_config"] == {"sp_backend": "deepspeed", "sp_size": 2, "dp_shard_size": 1}


def test_the_sbatch_script_trains_on_the_real_slurm(exported, trainer_venv, tmp_path):
    """Slurm here is one node (tests/slurm_cluster.py): the job's two "nodes" are two tasks on it (sbatch's command
    line: --nodes=1 --ntasks-per-node=2), and it has no GRES (--gpus-per-node=0); the script itself is unedited."""
    d = unzip(exported, tmp_path / "job")
    job, log = sbatch(d, trainer_venv, tmp_path / "slurm")
    assert "ulab ---" in log, log[-2000:]  # the default launcher
    lines = [json.loads(x) for f in (d / "runs" / f"ulysses-lab-{job}").glob("metrics*.jsonl") for x in f.open()]
    assert sorted({x["step"] for x in lines}) == list(range(1, STEPS + 1))


def test_the_sbatch_script_runs_accelerate_launch_on_the_data_its_variable_names(api, corpus, trainer_venv,
                                                                                tmp_path):
    """The same bundle, exported from a plan whose data path does not exist on the "cluster": ULAB_DATA_PATH names
    the data and ULAB_LAUNCHER=accelerate starts each node with `accelerate launch` and its Accelerate YAML (the main
    node's address on its command line, from SLURM_JOB_NODELIST); nothing in the bundle is edited."""
    plan = PLAN | {"run": {"steps": STEPS, "checkpoint_every": 0, "learning_rate": 1e-3,
                           "data": {"path": str(tmp_path / "not-on-this-cluster.txt")}}}
    r = api.post("/api/estimate/export.zip", json=plan)
    assert r.status_code == 200, r.text
    d = unzip(r.content, tmp_path / "job")
    job, log = sbatch(d, trainer_venv, tmp_path / "slurm", ULAB_LAUNCHER="accelerate", ULAB_DATA_PATH=str(corpus))
    assert "accelerate ---" in log, log[-2000:]
    lines = [json.loads(x) for f in (d / "runs" / f"ulysses-lab-{job}").glob("metrics*.jsonl") for x in f.open()]
    assert sorted({x["step"] for x in lines}) == list(range(1, STEPS + 1)), log[-3000:]


def sbatch(d: Path, venv: Path, slurm_dir: Path, **env: str) -> tuple[str, str]:
    """sbatch the unzipped bundle's script on the real slurmctld/slurmd, as is; (job id, its log) once it
    COMPLETED."""
    why = missing()
    if why:
        pytest.fail(f"Slurm is needed for this test: {why}")
    with slurm_cluster(slurm_dir) as cluster:
        shell = node_env(venv, SLURM_CONF=cluster.env["SLURM_CONF"], MAIN_NODE_PORT=str(free_port()), **env)
        job = run(["sbatch", "--parsable", "--partition=debug", "--nodes=1", "--ntasks-per-node=2",
                   "--gpus-per-node=0", "ulab-job.sbatch"], cwd=d, env=shell).split(";")[0]
        end = time.monotonic() + 400
        while True:
            out = cluster.scontrol("show", "job", "-o", job).stdout
            state = out.split("JobState=")[1].split()[0] if "JobState=" in out else "?"
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "?"):
                break
            assert time.monotonic() < end, out
            time.sleep(0.5)
        log = (d / f"ulab-{job}.log").read_text()
        assert state == "COMPLETED", log[-4000:]
    return job, log
