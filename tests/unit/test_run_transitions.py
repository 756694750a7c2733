"""backend/runs/transitions.py is the only writer of a run's state, and refuses what the state table refuses.
On SQLite (the embedded default); the same code runs on PostgreSQL in tests/integration."""
from __future__ import annotations

import ast

import pytest

from backend.core import db
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.states import IllegalTransition, RunState
from tests.boundaries import ROOT, packages_loaded, source_files
from tests.tiny import tiny_plan

S = RunState


pytestmark = pytest.mark.usefixtures("sqlite_db")


def new_run(**fields) -> int:
    """A run row as a test needs it (tests may set a state directly; the code base may not)."""
    with db.session_scope() as s:
        run = Run(name="r", spec=tiny_plan(), **fields)
        s.add(run)
        s.flush()
        return run.id


def load(run_id: int) -> Run:
    with db.session_scope() as s:
        return s.get(Run, run_id)


def on_run(run_id: int, change) -> Run:
    """Apply an API-side transition to the run in a session of its own, committed."""
    with db.session_scope() as s:
        run = s.get(Run, run_id)
        change(s, run)
    return load(run_id)


def test_a_run_from_approval_to_success():
    run_id = new_run()
    assert load(run_id).state == S.PENDING_APPROVAL  # the model's default: creating a run writes no state
    run = on_run(run_id, lambda s, r: transitions.approve(r, by=7, forced=True))
    assert (run.state, run.approved_by, run.forced) == (S.QUEUED, 7, True)
    assert run.approved_at
    claimed = transitions.claim(run_id, "host:1")
    assert claimed.state == S.STARTING
    assert claimed.worker == "host:1"
    assert claimed.started_at
    assert claimed.heartbeat_at
    assert transitions.claim(run_id, "host:2") is None  # a redelivered message finds it taken
    assert transitions.start(run_id, 1, "/runs/run-1")
    assert load(run_id).run_dir == "/runs/run-1"
    assert transitions.heartbeat(run_id, 1, last_step=5) is False
    assert transitions.heartbeat(run_id, 1, last_step=3) is False
    assert load(run_id).last_step == 5  # never back
    assert transitions.finish(run_id, 1, S.SUCCEEDED, None, last_step=9)
    run = load(run_id)
    assert (run.state, run.last_step, run.exit_reason) == (S.SUCCEEDED, 9, None)
    assert run.finished_at
    assert [(a.attempt, a.state, a.last_step, a.worker) for a in run.attempts] == [(1, "succeeded", 9, "host:1")]


@pytest.mark.parametrize("state", [S.QUEUED, S.PENDING_APPROVAL])
def test_finishing_a_run_that_has_not_started_is_refused(state):
    run_id = new_run(state=state.value)
    with pytest.raises(IllegalTransition):
        transitions.finish(run_id, 1, S.SUCCEEDED, None, last_step=3)
    run = load(run_id)
    assert (run.state, run.last_step, run.finished_at) == (state, 0, None)  # nothing written


def test_finishing_with_a_state_that_is_not_an_end_is_refused():
    run_id = new_run(state=S.RUNNING.value)
    with pytest.raises(IllegalTransition):
        transitions.finish(run_id, 1, S.STARTING, None)
    with pytest.raises(IllegalTransition):
        transitions.start(run_id, 1, "/elsewhere")  # running -> running
    assert load(run_id).state == S.RUNNING


@pytest.mark.parametrize("state", [S.SUCCEEDED, S.PENDING_APPROVAL, S.QUEUED, S.STARTING, S.RUNNING])
def test_retrying_a_run_that_did_not_end_badly_is_refused(state):
    run_id = new_run(state=state.value)
    with pytest.raises(IllegalTransition):
        on_run(run_id, lambda s, r: transitions.queue_retry(r))
    assert (load(run_id).state, load(run_id).attempt) == (state, 1)


@pytest.mark.parametrize("state", [S.FAILED, S.OOM, S.CANCELLED, S.LOST])
def test_a_retry_is_the_next_attempt_with_the_last_one_cleared(state):
    run_id = new_run(state=state.value, worker="w", exit_reason="x", cancel_requested=True)
    run = on_run(run_id, lambda s, r: transitions.queue_retry(r))
    assert (run.state, run.attempt, run.worker, run.exit_reason, run.cancel_requested) == (S.QUEUED, 2, None, None,
                                                                                           False)


@pytest.mark.parametrize("state", [S.FAILED, S.QUEUED, S.RUNNING, S.SUCCEEDED])
def test_approval_is_for_new_runs_only(state):
    run_id = new_run(state=state.value)
    with pytest.raises(IllegalTransition):
        on_run(run_id, lambda s, r: transitions.approve(r, by=1, forced=False))
    assert load(run_id).state == state


def test_cancel_ends_a_waiting_run_at_once_and_asks_an_active_one_to_stop():
    pending, queued_retry, running = new_run(), new_run(state="queued", attempt=2), new_run(state="running")
    run = on_run(pending, transitions.request_cancel)
    assert (run.state, run.exit_reason) == (S.CANCELLED, "cancelled before it started")
    assert run.finished_at
    assert on_run(queued_retry, transitions.request_cancel).exit_reason == "retry cancelled before it started"
    run = on_run(running, transitions.request_cancel)
    assert (run.state, run.cancel_requested) == (S.RUNNING, True)  # the worker records `cancelled`
    assert transitions.heartbeat(running, 1, 0) is True  # ... once its heartbeat learns it must stop
    assert transitions.finish(running, 1, S.CANCELLED, "cancelled by request")
    for state in (S.SUCCEEDED, S.FAILED, S.CANCELLED):
        run_id = new_run(state=state.value)
        with pytest.raises(IllegalTransition):
            on_run(run_id, transitions.request_cancel)


def test_a_lost_attempt_no_longer_writes_and_is_told_to_stop():
    run_id = new_run(state="queued")
    transitions.claim(run_id, "host:1")
    on_run(run_id, lambda s, r: (transitions.mark_lost(s, r, "no heartbeat"), transitions.queue_retry(r)))
    assert load(run_id).attempts[0].state == "lost"
    assert transitions.heartbeat(run_id, 1, 4) is True
    assert transitions.start(run_id, 1, "/late") is False
    assert transitions.finish(run_id, 1, S.SUCCEEDED, None) is False  # the old attempt's outcome is not recorded
    run = load(run_id)
    assert (run.state, run.attempt, run.run_dir) == (S.QUEUED, 2, None)


def test_only_a_started_run_can_be_lost():
    for state in (S.QUEUED, S.PENDING_APPROVAL, S.SUCCEEDED):
        run_id = new_run(state=state.value)
        with pytest.raises(IllegalTransition):
            on_run(run_id, lambda s, r: transitions.mark_lost(s, r, "?"))


def test_the_run_model_alone_knows_every_table_a_run_refers_to():
    # the worker imports transitions and never the plans module; a run's row must still be writable there
    packages_loaded("import backend.runs.transitions\nfrom backend.core.db import Base\n"
                    "[fk.column for t in Base.metadata.tables.values() for fk in t.foreign_keys]", ())


# --- nothing else writes a state ------------------------------------------------------------------------------

WRITER = "backend/runs/transitions.py"


def _is_state(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "state") or \
        (isinstance(node, ast.Constant) and node.value == "state")


def state_writes(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module writes a state: `x.state = ...` (plain, augmented, annotated or in a tuple), setattr(x,
    "state", ...), `.values(state=...)` / `.values({Run.state: ...})` / `.update({"state": ...})` (an UPDATE or
    INSERT through SQLAlchemy), `Run(state=...)`, and UPDATE ... SET state in SQL text."""
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and t.attr == "state" and isinstance(t.ctx, ast.Store):
                    found.append((node.lineno, f"assigns {ast.unparse(t)}"))
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "setattr" and len(node.args) > 1 and _is_state(node.args[1]):
                found.append((node.lineno, "setattr(..., 'state', ...)"))
            if name in ("values", "update", "Run") and any(k.arg == "state" for k in node.keywords):
                found.append((node.lineno, f"{name}(state=...)"))
            if name in ("values", "update") and any(isinstance(a, ast.Dict) and any(map(_is_state, a.keys))
                                                    for a in node.args):
                found.append((node.lineno, f"{name}({{state: ...}})"))
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            sql = " ".join(node.value.lower().split())
            if "update runs set" in sql and "state" in sql.split("update runs set", 1)[1].split(" where ")[0]:
                found.append((node.lineno, "UPDATE runs SET state in SQL"))
    return found


def test_only_transitions_writes_a_run_state():
    """Tests set up rows as they need; migrations may backfill. Everything else goes through transitions.py."""
    bad, writer = [], None
    for path in source_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("tests/", "migrations/")):
            continue
        writes = state_writes(ast.parse(path.read_text()))
        if rel == WRITER:
            writer = writes
        else:
            bad += [f"{rel}:{line}: {what}" for line, what in writes]
    assert not bad, "a run's state changes only in backend/runs/transitions.py:\n" + "\n".join(bad)
    assert writer, "the scan found no state write in transitions.py either: it no longer sees them"


@pytest.mark.parametrize("code", [
    "run.state = 'x'", "run.state, run.worker = 'x', None", "self.run.state: str = 'x'",
    "setattr(run, 'state', 'x')", "s.execute(update(Run).values(state='x'))", "update(Run).values({Run.state: 1})",
    "q.update({'state': 'x'})", "Run(name='n', state='x')", "s.execute(text('UPDATE runs SET state = :s WHERE id=1'))",
])
def test_the_scan_sees_each_way_of_writing_a_state(code):
    assert state_writes(ast.parse(code))


@pytest.mark.parametrize("code", [
    "x = run.state", "request.state.user = u", "update(Run).values(heartbeat_at=1)", "Run(name='n')",
    "text('UPDATE runs SET last_step = 1 WHERE state = :s')",
])
def test_the_scan_leaves_reads_and_other_fields_alone(code):
    assert not state_writes(ast.parse(code))


def test_success_needs_every_step_stored_else_the_gap_is_named():
    from backend.metrics.models import MetricPoint

    def run_with_steps(stored: list[int]) -> int:
        run_id = new_run(state=S.RUNNING.value, steps=5)
        with db.session_scope() as s:
            s.add_all(MetricPoint(run_id=run_id, rank=rank, step=step, name=name, value=1.0, wall_time=0.0)
                      for step in stored for rank in (0, 1) for name in ("loss", "lr"))
        return run_id

    complete = run_with_steps([1, 2, 3, 4, 5])
    assert transitions.finish(complete, 1, S.SUCCEEDED, None, last_step=5)
    assert (load(complete).state, load(complete).exit_reason) == (S.SUCCEEDED, None)
    gappy = run_with_steps([1, 2, 5])
    assert transitions.finish(gappy, 1, S.SUCCEEDED, None, last_step=5)
    run = load(gappy)
    assert run.state == S.FAILED
    assert run.exit_reason == "the trainer finished, but 2 of the 5 steps have no metrics stored"
    cancelled = run_with_steps([1])  # only success is checked: a stopped run has its own reason
    assert transitions.finish(cancelled, 1, S.CANCELLED, "cancelled by request")
    assert load(cancelled).exit_reason == "cancelled by request"
