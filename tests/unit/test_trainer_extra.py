"""`pip install 'ulysses-lab[trainer]'` (pyproject's `trainer` extra) holds every third-party package the trainer
(worker/trainer), the planner it builds its run from (plan/) and `ulab train` (backend/cli.py) import, so a cluster
node with no checkout can run the exports; the exports tell the node to install it."""
from __future__ import annotations

import re
import sys
import tomllib
from importlib.metadata import packages_distributions

from plan.exports import TRAINER_INSTALL, export_files
from tests.boundaries import ROOT, imports, imports_under
from tests.tiny import tiny_plan

OURS = {"plan", "worker", "backend", "tests", "bench"}
# imported inside `try: ... except ImportError` with a fallback, or only on GPU workers (the `gpu` extra)
OPTIONAL = {"datasets": "data.py reads a saved dataset's Arrow files itself without it",
            "liger_kernel": "GPU workers only (the gpu extra)", "flash_attn": "GPU image only"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def trainer_extra() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {_name(r) for r in project["optional-dependencies"]["trainer"]}


def test_the_trainer_extra_holds_everything_the_trainer_imports():
    found = [*imports_under("worker/trainer"), *imports_under("plan"), *imports(ROOT / "backend" / "cli.py")]
    # `ulab train` only: the other commands of backend/cli.py (serve, worker) import the service lazily
    tops = {i.top for i in found if not i.lazy or not i.file.startswith("backend/")}
    third_party = tops - OURS - set(sys.stdlib_module_names) - set(OPTIONAL) - {"__future__"}
    dists = packages_distributions()
    missing = {top: dists.get(top) for top in third_party
               if not any(_name(d) in trainer_extra() for d in dists.get(top, [top]))}
    assert not missing, f"imported by the trainer but not in the trainer extra: {missing}"


def test_the_extra_pins_what_the_base_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_name(r): r for r in project["dependencies"]}
    for r in project["optional-dependencies"]["trainer"]:
        if _name(r) in base:
            assert r == base[_name(r)], f"the trainer extra says {r}, the base {base[_name(r)]}"


def test_the_exports_install_the_trainer_extra():
    files = export_files(tiny_plan() | {"run": {"data": {"path": "data.txt"}}})
    assert TRAINER_INSTALL in files["README.txt"]
    assert TRAINER_INSTALL in files["ulab-job.sbatch"]
    assert "-m worker.trainer" in files["launch_node0.sh"]
    assert "-m worker.trainer" in files["ulab-job.sbatch"]
