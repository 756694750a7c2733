"""The import lines of DESIGN.md, checked on every import statement of the source (module level and inside
functions alike): plan/ imports nothing of ours and no web, database or torch (torch and transformers only
lazily, in the FakeTensor trace modules plan/traced.py and plan/traced_liger.py); backend/ never imports worker/
(the API sends tasks by name; the `ulab` entry point, backend/cli.py, starts everything and may); the trainer
(worker/trainer/) never imports the backend nor the rest of worker/; the rest of worker/ reaches the backend only
through the seam (backend/execution/agent.py) and the settings; and the modules of backend/ import each other without
a cycle, function-local imports included."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.boundaries import (
    ROOT,
    cycles,
    imports,
    imports_under,
    imports_within,
    module_graph,
    packages_loaded,
)

OURS = {"backend", "worker", "tests", "bench"}
WEB_AND_DATABASE = {"fastapi", "starlette", "sqlalchemy"}
TRAINING_STACK = {"torch", "transformers", "deepspeed", "accelerate"}
LAZY_TRAINING_STACK_ALLOWED_IN = ("plan/traced.py", "plan/traced_liger.py")
ENTRY_POINT = "backend/cli.py"
SEAM = "backend.execution.agent"
WORKER_MAY_IMPORT = {SEAM, "backend.core.settings"}


def _listing(found) -> str:
    return "\n".join(map(str, found))


def test_plan_imports_nothing_of_ours_and_no_web_or_database():
    bad = [i for i in imports_under("plan") if i.top in OURS | WEB_AND_DATABASE]
    assert not bad, "plan/ is a pure library:\n" + _listing(bad)


def test_plan_imports_the_training_stack_only_lazily_and_only_in_traced():
    bad = [i for i in imports_under("plan") if i.top in TRAINING_STACK
           and not (i.lazy and i.file in LAZY_TRAINING_STACK_ALLOWED_IN)]
    where = ", ".join(LAZY_TRAINING_STACK_ALLOWED_IN)
    assert not bad, f"torch and transformers only inside functions of {where}:\n" + _listing(bad)


def test_backend_never_imports_the_worker_except_the_entry_point():
    bad = [i for i in imports_under("backend") if i.top == "worker" and i.file != ENTRY_POINT]
    assert not bad, "the backend sends tasks by name (backend/core/queue.py):\n" + _listing(bad)


def test_the_trainer_never_imports_the_backend():
    # nor the rest of worker/, which imports the backend
    bad = [i for i in imports_under("worker/trainer") if i.top == "backend"
           or (i.top == "worker" and i.module != "worker.trainer" and not i.module.startswith("worker.trainer."))]
    assert not bad, "worker/trainer/ runs under torchrun without the service:\n" + _listing(bad)


def test_the_trainer_names_no_module_as_the_backend_or_the_planner_does():
    """A module name means one thing: none of the trainer's modules shares its name with one of backend/ or plan/
    (a `states.py` of run states there and of rank state placement here read as the same room)."""
    def names(package: str) -> set[str]:
        return {p.name for p in (ROOT / package).rglob("*.py") if p.name != "__init__.py"}

    shared = names("worker/trainer") & (names("backend") | names("plan"))
    assert not shared, "worker/trainer/ modules named as backend/ or plan/ ones: " + ", ".join(sorted(shared))


def test_the_worker_reaches_the_backend_only_through_the_seam():
    bad = [i for i in imports_under("worker") if i.top == "backend" and i.module not in WORKER_MAY_IMPORT]
    assert not bad, f"worker/ imports of the backend go through {SEAM} (or the settings):\n" + _listing(bad)


def test_the_backend_modules_have_no_import_cycle():
    """Module by module, function-local imports included: a cycle hidden behind a lazy import is still a cycle."""
    found = imports_under("backend")
    loops = cycles(module_graph(found))
    assert not loops, "import cycles between modules of backend/:\n" + "\n\n".join(
        " <-> ".join(loop) + ":\n" + _listing(imports_within(found, loop)) for loop in loops)


def test_a_cycle_through_a_lazy_import_is_found_and_named(tmp_path):
    sources = {"backend/runs/service.py": "from backend.core import db\nfrom backend.probes import service\n",
               "backend/probes/service.py": "def f():\n    from backend.runs.service import enqueue\n",
               "backend/core/db.py": "import sqlalchemy\nfrom . import settings\n",
               "backend/core/settings.py": "import os\n",
               "backend/main.py": "import backend.runs.service\n"}
    for rel, source in sources.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(source)
    found = [i for rel in sources for i in imports(tmp_path / rel, root=tmp_path)]
    graph = module_graph(found)
    assert graph == {"backend.runs.service": {"backend.core.db", "backend.probes.service"},
                     "backend.probes.service": {"backend.runs.service"},
                     "backend.core.db": {"backend.core.settings"}, "backend.core.settings": set(),
                     "backend.main": {"backend.runs.service"}}
    assert cycles(graph) == [["backend.probes.service", "backend.runs.service"]]
    assert [str(i) for i in imports_within(found, ["backend.probes.service", "backend.runs.service"])] == [
        "backend/runs/service.py:2: import backend.probes",
        "backend/probes/service.py:2: lazy import backend.runs.service"]
    assert cycles({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": set()}) == []
    assert cycles({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}}) == [["a.x", "a.y", "a.z"]]


def test_the_worker_task_module_loads_no_web_framework():
    assert packages_loaded("import worker.tasks", ("fastapi", "starlette")) == []


def test_the_worker_loads_no_database_library():
    """Workers speak HTTP only (backend/execution/agent.py): the Celery task, a gang node, a Slurm job, a probe's
    launcher
    and the tracker forwarder load no SQLAlchemy, so none of them could reach the database if it held its URL."""
    code = "import worker.tasks, worker.gang, worker.slurm_job, worker.probe, worker.trackers, worker.celery_app"
    assert packages_loaded(code, ("sqlalchemy", "psycopg", "alembic")) == []


def test_the_worker_task_module_loads_no_training_stack():
    """The Celery worker starts the trainer as a process: importing its tasks (a worker start, 2.3 CPU-s with
    Transformers and torch, 0.5 s without) loads none of them. It reads the trainer's stop file through stop_rules.py,
    which keeps the Transformers callback in callbacks.py."""
    assert packages_loaded("import worker.tasks", tuple(sorted(TRAINING_STACK))) == []


def test_the_probe_launcher_and_the_slurm_job_load_no_training_stack():
    """`ulab probe`, the Celery task of a probe and every Slurm job import worker.probe (the launcher); only its
    ranks (probe_ranks.py, under torchrun) need torch and Transformers: 1.7 CPU-s per launch when it loaded them."""
    assert packages_loaded("import worker.probe, worker.slurm_job", tuple(sorted(TRAINING_STACK))) == []


def test_a_rank_imports_deepspeed_without_mlflow_and_freezes_its_imports():
    """DeepSpeed's autotuner imports mlflow (and pandas, pyarrow) at DeepSpeed's import when it is installed; a
    rank hides it for that import (train.import_deepspeed), and mlflow stays importable. settle_imports moves the
    objects alive after the imports out of the collector's sight (gc.freeze)."""
    code = ("import gc; from worker.trainer.train import import_deepspeed, settle_imports; import_deepspeed(); "
            "assert 'mlflow' not in sys.modules, 'DeepSpeed imported mlflow'; settle_imports(); "
            "assert gc.get_freeze_count() > 100_000, gc.get_freeze_count(); import mlflow")
    assert packages_loaded(code, ("deepspeed", "mlflow")) == ["deepspeed", "mlflow"]


def test_the_slurm_job_builds_no_celery_app_and_writes_nothing(tmp_path):
    home = tmp_path / "home"
    code = ("import json, sys, worker.slurm_job\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('worker.'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "ULAB_HOME": str(home)})
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = r.stdout.strip().splitlines()[-1]
    assert "worker.celery_app" not in loaded, loaded
    assert "worker.tasks" not in loaded, loaded
    assert not home.exists(), list(tmp_path.iterdir())
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_the_api_loads_no_worker_module():
    assert packages_loaded("import backend.main; backend.main.create_app()", ("worker",)) == []


def test_every_kind_of_import_is_seen(tmp_path):
    pkg = tmp_path / "plan" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "m.py").write_text(textwrap.dedent("""\
        import backend.core
        from . import sibling
        from ..other import thing
        if True:
            from worker import tasks
        def f():
            import torch
            importlib.import_module("sqlalchemy.orm")
        class C:
            def g(self):
                from fastapi import FastAPI
        """))
    found = [(i.module, i.lazy) for i in imports(pkg / "m.py", root=tmp_path)]
    assert found == [("backend.core", False), ("plan.sub.sibling", False), ("plan.other", False),
                     ("worker", False), ("torch", True), ("sqlalchemy.orm", True), ("fastapi", True)]


def test_the_source_scan_covers_the_packages():
    scanned = {i.file.split("/")[0] for i in imports_under()}
    assert {"plan", "backend", "worker", "tests", "bench"} <= scanned
    assert (ROOT / ENTRY_POINT).is_file()
    assert all((ROOT / f).is_file() for f in LAZY_TRAINING_STACK_ALLOWED_IN)


def test_source_files_leave_out_build_output(tmp_path):
    """`make gpu-rehearsal` leaves `pip wheel .`'s build/lib copies of every package at the top of the checkout; a
    `make test` after it failed the run-state writer check on build/lib/backend/runs/transitions.py."""
    from tests.boundaries import source_files

    for rel in ("backend/runs/transitions.py", "build/lib/backend/runs/transitions.py", "dist/x.py",
                "plan/build/kept.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    found = [p.relative_to(tmp_path).as_posix() for p in source_files(root=tmp_path)]
    assert found == ["backend/runs/transitions.py", "plan/build/kept.py"]
