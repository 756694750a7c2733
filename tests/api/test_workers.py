"""Workers say what they can run (trainer/capabilities.py -> backend/workers): GET /api/workers lists it, and approval
refuses a plan whose attention kernel or Liger no running worker of its queue has, naming the field."""
from __future__ import annotations

from tests.api.conftest import as_role
from tests.tiny import tiny_plan


def _report(name: str, queues: list[str], attn: list[str], gpu: str | None = "NVIDIA H100 80GB HBM3",
            liger: str | None = None) -> None:
    from backend.core.db import session_scope
    from backend.workers import service

    versions = {"torch": "2.11.0", "cuda": "13.0", "deepspeed": "0.19.8", "transformers": "5.23.0",
                "accelerate": "1.15.0", "flash_attn": "2.8.3" if "flash_attention_2" in attn else None,
                "flash_attn_3": None, "liger_kernel": liger}
    with session_scope() as s:
        service.report(s, name, queues, {"versions": versions, "gpu_model": gpu, "gpu_count": 8 if gpu else 0,
                                         "attn_implementations": attn})


def _stop(*names: str) -> None:
    from backend.core.db import session_scope
    from backend.workers import service

    with session_scope() as s:
        for n in names:
            service.stopped(s, n)


def _approve(client, admin, tmp_path, plan: dict):
    data = tmp_path / "d.txt"
    data.write_text("x " * 2000)
    plan_id = client.post("/api/plans", json=plan, headers=admin).json()["id"]
    r = client.post("/api/runs", json={"plan_id": plan_id, "run": {"steps": 3, "data": {"path": str(data)}}},
                    headers=admin)
    assert r.status_code == 201, r.text
    return client.post(f"/api/runs/{r.json()['id']}/approve", headers=admin)


def test_this_machines_capabilities_are_read_from_what_is_installed():
    import torch
    import transformers

    from worker.trainer.capabilities import capabilities

    caps = capabilities()
    assert caps["versions"]["torch"] == torch.__version__
    assert caps["versions"]["transformers"] == transformers.__version__
    assert caps["gpu_model"] is None
    assert caps["gpu_count"] == 0  # this machine: CPU ranks
    assert "sdpa" in caps["attn_implementations"]
    assert "flash_attention_2" not in caps["attn_implementations"]


def test_workers_are_listed_and_approval_refuses_a_kernel_no_worker_of_the_queue_has(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    _report("celery@gpu-a", ["gpu-h100-80gb"], ["eager", "flash_attention_2", "sdpa"])
    _report("celery@gpu-b", ["gpu-h100-80gb"], ["eager", "flash_attention_2", "sdpa"])
    try:
        listed = client.get("/api/workers", headers=as_role(client, tokens, "viewer"))
        assert listed.status_code == 200, listed.text
        mine = {w["name"]: w for w in listed.json()}
        assert mine["celery@gpu-a"]["gpu_model"] == "NVIDIA H100 80GB HBM3"
        assert mine["celery@gpu-a"]["versions"]["flash_attn"] == "2.8.3"
        assert mine["celery@gpu-a"]["stopped_at"] is None

        plan = tiny_plan()
        plan["training"]["attn_implementation"] = "flash_attention_3"
        r = _approve(client, admin, tmp_path, plan)
        assert r.status_code == 409, r.text
        assert r.json()["detail"][0] == {
            "field": "training.attn_implementation",
            "message": "flash_attention_3 is not installed on any gpu-h100-80gb worker (they have eager, "
                       "flash_attention_2, sdpa)"}, r.text

        plan["training"]["attn_implementation"] = "flash_attention_2"
        assert _approve(client, admin, tmp_path, plan).status_code == 200
        plan["training"]["liger_kernel"] = True
        r = _approve(client, admin, tmp_path, plan)
        assert r.status_code == 409, r.text
        assert r.json()["detail"][0]["field"] == "training.liger_kernel", r.text
    finally:
        _stop("celery@gpu-a", "celery@gpu-b")
    # no running worker of the queue: nothing is known, nothing refused (the run waits for a worker)
    plan = tiny_plan()
    plan["training"]["attn_implementation"] = "flash_attention_3"
    assert _approve(client, admin, tmp_path, plan).status_code == 200
    stopped = {w["name"]: w for w in client.get("/api/workers", headers=admin).json()}
    assert stopped["celery@gpu-a"]["stopped_at"] is not None


def test_a_cpu_worker_takes_any_attention_since_it_runs_sdpa(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    _report("celery@cpu", ["gpu-h100-80gb"], ["eager", "flex_attention", "sdpa"], gpu=None)
    try:
        plan = tiny_plan()
        plan["training"]["attn_implementation"] = "flash_attention_3"
        assert _approve(client, admin, tmp_path, plan).status_code == 200
    finally:
        _stop("celery@cpu")


def test_the_dry_run_says_which_attention_runs():
    from plan import Plan
    from plan.launch import attention_that_runs

    plan = Plan.model_validate(tiny_plan())
    plan.training.attn_implementation = "flash_attention_2"
    assert attention_that_runs(plan, cuda=False)["runs"] == "sdpa"  # CPU ranks
    on_gpu = attention_that_runs(plan, cuda=True, installed=["eager", "flash_attention_2", "sdpa"])
    assert on_gpu["runs"] == "flash_attention_2"
    missing = attention_that_runs(plan, cuda=True, installed=["eager", "sdpa"])  # flash-attn not installed
    assert missing["runs"] is None
    assert "not installed" in missing["note"]
