"""The plan-v1 contract checker (tests/contract/) passes against the installed `ulab` script."""
import subprocess
import sys
from pathlib import Path

from tests.boundaries import packages_loaded

CHECKER = Path(__file__).resolve().parents[1] / "contract" / "check_plan_contract.py"
ULAB = Path(sys.executable).parent / "ulab"


def test_plan_contract_checker_passes():
    assert ULAB.exists(), f"{ULAB} missing: pip install -e . in this venv"
    r = subprocess.run([sys.executable, str(CHECKER), str(ULAB)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failed checks" in r.stdout


def test_planner_is_a_pure_library():
    code = "import plan as p; p.estimate({})"
    assert packages_loaded(code, ("torch", "fastapi", "sqlalchemy", "transformers")) == []
