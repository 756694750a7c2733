"""Recommend puts first what the plan's queue can run: the attention kernels (and Liger) its live workers report
(backend/workers/service.queue_offer); an option needing a kernel they lack comes after, saying so. Fix moves a plan
to what the queue has, and a worker whose heartbeat stopped counts for nothing."""
from __future__ import annotations

from datetime import timedelta

from tests.api.conftest import as_role
from tests.tiny import tiny_plan

QUEUE = "gpu-h100-80gb"
FLASH = {"flash_attention_2", "flash_attention_3"}


def _report(name: str, attn: list[str], liger: str | None = None) -> None:
    from backend.core.db import session_scope
    from backend.workers import service

    versions = {"torch": "2.11.0", "flash_attn": "2.8.3" if "flash_attention_2" in attn else None,
                "flash_attn_3": "3.0.0" if "flash_attention_3" in attn else None, "liger_kernel": liger}
    with session_scope() as s:
        service.report(s, name, [QUEUE], {"versions": versions, "gpu_model": "NVIDIA H100 80GB HBM3", "gpu_count": 8,
                                          "attn_implementations": attn})


def _stop(*names: str) -> None:
    from backend.core.db import session_scope
    from backend.workers import service

    with session_scope() as s:
        for n in names:
            service.stopped(s, n)


def _silence(name: str, seconds: float) -> None:
    """The worker's last heartbeat `seconds` ago (what a SIGKILLed worker leaves: tests/integration/
    test_worker_liveness.py kills a real one)."""
    from sqlalchemy import select

    from backend.core.db import session_scope
    from backend.runs.transitions import now
    from backend.workers.models import Worker

    with session_scope() as s:
        w = s.scalar(select(Worker).where(Worker.name == name))
        w.heartbeat_at = now() - timedelta(seconds=seconds)


def _open_plan() -> dict:
    """A Hopper plan that leaves the attention kernel (and the layout) to the search."""
    plan = tiny_plan()
    del plan["training"]["attn_implementation"]
    return plan


def _kernels(answer: dict) -> set[str]:
    return {r["plan"]["training"]["attn_implementation"] for r in answer["recommendations"] + answer["rejected"]}


def _runnable_first(answer: dict) -> set[str]:
    """The attention kernels of the options the queue can run, after checking that they all come before the options
    it cannot, and that each of those names the kernel it lacks."""
    recs = answer["recommendations"]
    lacking = [bool(r["missing_kernels"]) for r in recs]
    assert lacking == sorted(lacking), [(r["plan"]["training"]["attn_implementation"], r["missing_kernels"])
                                        for r in recs]
    for r in recs:
        attn = r["plan"]["training"]["attn_implementation"]
        assert attn in r["kernels"], r
        if r["missing_kernels"]:
            assert r["missing_kernels"] == [attn], r
            assert f"needs {attn}, which no live worker of the plan's queue has" in r["unavailable"], r
        else:
            assert r["unavailable"] is None, r
    return {r["plan"]["training"]["attn_implementation"] for r in recs if not r["missing_kernels"]}


def test_recommend_puts_a_flash_kernel_after_sdpa_on_a_queue_with_only_sdpa(client, tokens):
    viewer = as_role(client, tokens, "viewer")
    # no worker up: the search proposes the flash kernels (Hopper: FA2 and FA3)
    free = client.post("/api/estimate/recommend", json={"plan": _open_plan()}, headers=viewer)
    assert free.status_code == 200, free.text
    assert free.json()["queue_kernels"] is None, free.json()
    assert "flash_attention_3" in _kernels(free.json()), free.json()

    _report("celery@sdpa-only", ["sdpa"])
    try:
        r = client.post("/api/estimate/recommend", json={"plan": _open_plan()}, headers=viewer)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["queue_kernels"] == ["sdpa"], body
        assert body["recommendations"], body
        assert _runnable_first(body) == {"sdpa"}, body
        assert body["recommendations"][0]["plan"]["training"]["attn_implementation"] == "sdpa"
        assert {"flash_attention_2", "flash_attention_3"} <= _kernels(body), _kernels(body)  # shown, after sdpa
        longest = client.post("/api/estimate/recommend", json={"plan": _open_plan(), "longest": True}, headers=viewer)
        assert longest.status_code == 200, longest.text
        assert _runnable_first(longest.json()) == {"sdpa"}, longest.text

        # a plan that asks for FA3 itself: refused, naming the field, rather than recommended
        plan = tiny_plan()
        plan["training"]["attn_implementation"] = "flash_attention_3"
        asked = client.post("/api/estimate/recommend", json={"plan": plan}, headers=viewer).json()
        assert asked["recommendations"] == []
        assert asked["errors"][0]["field"] == "training.attn_implementation"
        assert "flash_attention_3 is not installed" in asked["errors"][0]["message"], asked

        # fix: the plan is moved to what the queue has (first change, even though the plan fits), no Liger
        fixed = client.post("/api/estimate/fix", json=plan, headers=viewer)
        assert fixed.status_code == 200, fixed.text
        f = fixed.json()
        assert f["changes"][0] == {**f["changes"][0], "field": "training.attn_implementation",
                                   "from": "flash_attention_3", "to": "sdpa"}, f["changes"]
        assert f["plan"]["training"]["attn_implementation"] == "sdpa"
        assert f["queue_kernels"] == ["sdpa"]
    finally:
        _stop("celery@sdpa-only")


def test_the_cli_reads_the_queues_kernels_with_from_workers(client, tokens, tmp_path):
    """`ulab plan --recommend/--fix --from-workers` asks the same database the API does (ULAB_DATABASE_URL)."""
    import json

    from typer.testing import CliRunner

    from backend.cli import app as ulab

    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(_open_plan()))
    _report("celery@sdpa-cli", ["sdpa"])
    try:
        res = CliRunner().invoke(ulab, ["plan", "--json", str(plan_file), "--recommend", "--from-workers"])
        assert res.exit_code == 0, res.output
        assert _runnable_first(json.loads(res.output)) == {"sdpa"}
        plain = CliRunner().invoke(ulab, ["plan", "--json", str(plan_file), "--recommend"])
        assert not any(r["missing_kernels"] for r in json.loads(plain.output)["recommendations"])  # nothing known
        assert json.loads(plain.output)["recommendations"][0]["plan"]["training"]["attn_implementation"] != "sdpa"
        asked = _open_plan()
        asked["training"]["attn_implementation"] = "flash_attention_2"
        plan_file.write_text(json.dumps(asked))
        res = CliRunner().invoke(ulab, ["plan", "--json", str(plan_file), "--fix", "--from-workers"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["plan"]["training"]["attn_implementation"] == "sdpa"
    finally:
        _stop("celery@sdpa-cli")


def test_fix_proposes_liger_only_where_a_worker_of_the_queue_has_it(client, tokens):
    viewer = as_role(client, tokens, "viewer")
    # Llama-3.1-8B at 262K on 8 H100s: Liger alone makes it fit (tests/unit/test_planner_advice.py)
    plan = {"model": {"preset": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8},
            "parallel": {"sp_size": 4, "dp_size": 2}, "training": {"seq_len": 262144}}
    _report("celery@fa2", ["flash_attention_2", "sdpa"])
    try:
        without = client.post("/api/estimate/fix", json=plan, headers=viewer).json()
        assert without["fits"], without
        assert without["changes"], without
        assert "training.liger_kernel" not in {c["field"] for c in without["changes"]}, without["changes"]
        recs = client.post("/api/estimate/recommend", json={"plan": plan}, headers=viewer).json()["recommendations"]
        assert recs, recs
        assert not any(r["plan"]["training"]["liger_kernel"] for r in recs), recs
        _report("celery@fa2", ["flash_attention_2", "sdpa"], liger="0.6.4")
        withit = client.post("/api/estimate/fix", json=plan, headers=viewer).json()
        assert [c["field"] for c in withit["changes"]] == ["training.liger_kernel"], withit["changes"]
        recs = client.post("/api/estimate/recommend", json={"plan": plan}, headers=viewer).json()["recommendations"]
        assert any(r["plan"]["training"]["liger_kernel"] for r in recs), recs
    finally:
        _stop("celery@fa2")


def test_a_worker_without_a_gpu_limits_nothing(client, tokens):
    """CPU ranks run any attention as sdpa (approval takes any kernel on such a queue) and say nothing of the GPUs the
    plan is for: with one up beside a GPU worker that has only sdpa, the flash kernels stay on offer."""
    from backend.core.db import session_scope
    from backend.workers import service

    viewer = as_role(client, tokens, "viewer")
    _report("celery@sdpa-gpu", ["sdpa"])
    with session_scope() as s:
        service.report(s, "celery@cpu-rehearsal", [QUEUE], {"versions": {}, "gpu_model": None, "gpu_count": 0,
                                                             "attn_implementations": ["eager", "sdpa"]})
    try:
        body = client.post("/api/estimate/recommend", json={"plan": _open_plan()}, headers=viewer).json()
        assert "queue_kernels" not in body or body["queue_kernels"] is None, body
        assert "flash_attention_3" in _kernels(body)
    finally:
        _stop("celery@sdpa-gpu", "celery@cpu-rehearsal")


def test_a_lost_worker_counts_for_nothing(client, tokens, tmp_path):
    """A worker whose heartbeat is older than worker_lost_after_s is `lost` on GET /api/workers, its kernels are not
    the queue's at approval, and recommend no longer proposes them."""
    viewer, admin = as_role(client, tokens, "viewer"), as_role(client, tokens, "admin")
    _report("celery@fa3", ["flash_attention_2", "flash_attention_3", "sdpa"])
    _report("celery@fa2-only", ["flash_attention_2", "sdpa"])
    try:
        plan = tiny_plan()
        plan["training"]["attn_implementation"] = "flash_attention_3"
        assert _approve(client, admin, tmp_path, plan).status_code == 200
        assert "flash_attention_3" in _kernels(client.post("/api/estimate/recommend", json={"plan": _open_plan()},
                                                           headers=viewer).json())

        _silence("celery@fa3", 3600)
        states = {w["name"]: w["state"] for w in client.get("/api/workers", headers=viewer).json()}
        assert states["celery@fa3"] == "lost", states
        assert states["celery@fa2-only"] == "up", states
        r = _approve(client, admin, tmp_path, plan)
        assert r.status_code == 409, r.text
        assert r.json()["detail"][0]["field"] == "training.attn_implementation", r.text
        assert _runnable_first(client.post("/api/estimate/recommend", json={"plan": _open_plan()},
                                           headers=viewer).json()) == {"flash_attention_2"}
    finally:
        _stop("celery@fa3", "celery@fa2-only")


def _approve(client, admin, tmp_path, plan: dict):
    data = tmp_path / "d.txt"
    data.write_text("x " * 2000)
    plan_id = client.post("/api/plans", json=plan, headers=admin).json()["id"]
    r = client.post("/api/runs", json={"plan_id": plan_id, "run": {"steps": 3, "data": {"path": str(data)}}},
                    headers=admin)
    assert r.status_code == 201, r.text
    return client.post(f"/api/runs/{r.json()['id']}/approve", headers=admin)
