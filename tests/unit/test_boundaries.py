"""The import lines of DESIGN.md, checked on every import statement of the source (module level and inside
functions alike): plan/ imports nothing of ours and no web, database or torch (torch and transformers only
lazily, in the FakeTensor trace modules plan/traced.py and plan/traced_liger.py); backend/ never imports worker/
(the API sends tasks by name; the `ulab` entry point, backend/cli.py, starts everything and may); the trainer
(worker/trainer/) never imports the backend."""
from __future__ import annotations

import textwrap

from tests.boundaries import ROOT, imports, imports_under, packages_loaded

OURS = {"backend", "worker", "tests", "bench"}
WEB_AND_DATABASE = {"fastapi", "starlette", "sqlalchemy"}
TRAINING_STACK = {"torch", "transformers", "deepspeed", "accelerate"}
LAZY_TRAINING_STACK_ALLOWED_IN = ("plan/traced.py", "plan/traced_liger.py")
ENTRY_POINT = "backend/cli.py"


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
    assert (ROOT / ENTRY_POINT).is_file() and all((ROOT / f).is_file() for f in LAZY_TRAINING_STACK_ALLOWED_IN)
