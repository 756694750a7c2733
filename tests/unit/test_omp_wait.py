"""The worker package's processes (the trainer's launcher and ranks, the probe, the Celery worker) let OpenMP's idle
threads sleep unless the environment says otherwise (worker/__init__.py; figures: bench/omp_wait.py)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READ = ("import sys, os, worker.trainer.rank; import torch; "
        "print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)")


def policy_in_a_rank(env_policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    out = subprocess.run([sys.executable, "-c", READ], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()[0]


def test_a_rank_lets_openmp_threads_sleep_by_default():
    assert policy_in_a_rank(None) == "PASSIVE"


def test_a_policy_the_environment_sets_is_kept():
    assert policy_in_a_rank("ACTIVE") == "ACTIVE"


def test_the_policy_is_set_before_torch_loads_libgomp():
    """libgomp reads OMP_WAIT_POLICY once, when torch loads it: importing the package must not import torch."""
    out = subprocess.run([sys.executable, "-c", "import sys, worker; print('torch' in sys.modules)"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
