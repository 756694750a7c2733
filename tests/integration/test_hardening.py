"""Input hardening against the real API process on PostgreSQL, where the lone-surrogate 500 arose:
PostgreSQL's json type takes the escape "\\ud800", so the row was committed and every later list that read it failed.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.services import Stack, own_stack, postgres_database, redis_database
from tests.tiny import tiny_plan


@pytest.fixture(scope="module")
def pg_stack(tmp_path_factory):
    with own_stack(tmp_path_factory.mktemp("harden"), worker=False) as s:
        yield s


def test_a_lone_surrogate_never_reaches_postgresql_and_lists_keep_answering(pg_stack):
    with pg_stack.client() as api:
        good = api.post("/api/plans", json=tiny_plan()).json()["id"]
        r = api.post("/api/runs", json={"plan_id": good, "run": {"data": {"path": "/tmp/x.txt"}}})
        assert r.status_code == 201, r.text
        run_id = r.json()["id"]
        body = json.dumps(tiny_plan()).replace('"vocab_size": 512', '"vocab_size": 512, "note": "\\ud800"')
        r = api.post("/api/plans", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["field"] == "model.config.note"
        # the name of a run, too (a different table and a text column)
        r = api.post("/api/runs", content=json.dumps({"plan_id": good, "name": "\ud800",
                                                      "run": {"data": {"path": "/tmp/x.txt"}}}),
                     headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["field"] == "name", r.text
        for path in ("/api/plans", f"/api/plans/{good}", "/api/runs", "/api/runs?state=pending_approval",
                     "/api/runs?q=plan", f"/api/runs/{run_id}"):
            assert api.get(path).status_code == 200, path
        assert [p["id"] for p in api.get("/api/plans").json()] == [good]


def test_the_session_check_holds_for_writers_beside_the_api(pg_stack, monkeypatch):
    """The CLI and the worker write through sessions of their own: the same check stops the row on PostgreSQL."""
    import psycopg

    from backend.core import db, settings
    from backend.core.text import UnstorableValue
    from backend.plans.models import Plan

    monkeypatch.setenv("ULAB_DATABASE_URL", pg_stack.database_url)
    for clear in (settings.get_settings, db.get_engine, db.get_sessionmaker):
        clear.cache_clear()
    try:
        with pytest.raises(UnstorableValue):
            with db.session_scope() as session:
                session.add(Plan(name="cli", spec={"model": {"config": {"note": "\ud800"}}}, estimate={}))
    finally:
        db.get_engine().dispose()
        for clear in (settings.get_settings, db.get_engine, db.get_sessionmaker):
            clear.cache_clear()
    with psycopg.connect(pg_stack.database_url.replace("+psycopg", "")) as conn:
        assert conn.execute("SELECT count(*) FROM plans WHERE name = 'cli'").fetchone() == (0,)


def test_a_data_path_made_a_symlink_out_of_the_roots_is_refused_when_the_worker_claims(api, tmp_path):
    """The real worker claims through transitions.claim, which checks the paths again."""
    from tests.services import REPO
    from tests.tiny import submit, wait_for

    later = tmp_path / "later"  # under the stack's allowed root (the temp directory), and absent at submit
    run = submit(api, tiny_plan(), {"steps": 2, "data": {"path": str(later / "sample.txt")}}, approve=False)
    # a directory outside the allowed roots (not the repository: a clone may sit under the temp directory)
    outside = Path.home() / ".cache" / f"ulab-outside-roots-{run['id']}-{os.getpid()}"
    outside.mkdir(parents=True)
    try:
        shutil.copy(REPO / "examples" / "data" / "sample.txt", outside / "sample.txt")
        later.symlink_to(outside, target_is_directory=True)
        assert api.post(f"/api/runs/{run['id']}/approve").status_code == 200
        done = wait_for(api, run["id"], {"failed"}, timeout_s=120)
    finally:
        shutil.rmtree(outside, ignore_errors=True)
    assert done["exit_reason"].startswith("refused when claimed: run.data.path: "), done["exit_reason"]


def test_rows_poisoned_before_the_check_are_repaired_by_the_migration(tmp_path, monkeypatch):
    """A database that took a lone surrogate before this check (revision 0007): migration 0008 rewrites it, so the
    lists answer again without anyone deleting the row by hand."""
    import psycopg
    from alembic import command

    import plan as planner
    from backend.core import db, settings

    poisoned = json.dumps(tiny_plan()).replace('"vocab_size": 512', '"vocab_size": 512, "note": "a\\ud800b"')
    with postgres_database() as pg, redis_database() as broker:
        monkeypatch.setenv("ULAB_DATABASE_URL", pg)
        for clear in (settings.get_settings, db.get_engine, db.get_sessionmaker):
            clear.cache_clear()
        try:
            command.upgrade(db.alembic_config(), "0007")
        finally:
            db.get_engine().dispose()
            for clear in (settings.get_settings, db.get_engine, db.get_sessionmaker):
                clear.cache_clear()
        with psycopg.connect(pg.replace("+psycopg", "")) as conn:
            conn.execute("INSERT INTO plans (name, spec, estimate) VALUES ('old', %s::json, %s::json)",
                         (poisoned, json.dumps(planner.estimate(tiny_plan()))))
            conn.execute("INSERT INTO runs (name, plan_id, state, spec, attempt, max_retries, priority, "
                         "cancel_requested, forced, last_step, steps) VALUES "
                         "('old run', 1, 'failed', %s::json, 1, 0, 0, false, false, 0, 1)", (poisoned,))
        s = Stack(tmp_path / "old", pg, broker, worker=False).start()  # `ulab serve` migrates to head first
        try:
            with s.client() as api:
                plans = api.get("/api/plans")
                assert plans.status_code == 200, plans.text
                assert plans.json()[0]["plan"]["model"]["config"]["note"] == "a?b"
                runs = api.get("/api/runs")
                assert runs.status_code == 200
                assert runs.json()[0]["spec"]["model"]["config"]["note"] == "a?b"
        finally:
            s.stop()
