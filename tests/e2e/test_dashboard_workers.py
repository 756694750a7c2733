"""The Workers page and a refused approval in Chromium: the stack's real Celery worker (CPU ranks) as it reported
itself at start, beside a GPU worker's report written into the database (the one mock: no GPU here), and a run
whose attention kernel no running worker of its queue has refused at approval, naming the field."""
import time

import pytest

from tests.e2e.browser import chromium_page, screenshot, to_docs
from tests.tiny import submit, tiny_plan

pytestmark = pytest.mark.slow
GPU_WORKER = "celery@gpu-node-01"


def _gpu_worker(pg_url: str, up: bool) -> None:
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    from backend.workers import service

    engine = sa.create_engine(pg_url)
    try:
        with Session(engine) as s:
            if up:
                service.report(s, GPU_WORKER, ["gpu-h100-80gb"], {
                    "gpu_model": "NVIDIA H100 80GB HBM3", "gpu_count": 8,
                    "versions": {"torch": "2.11.0", "cuda": "13.0", "deepspeed": "0.19.8", "transformers": "5.23.0",
                                 "accelerate": "1.15.0", "flash_attn": "2.8.3", "flash_attn_3": None,
                                 "liger_kernel": "0.8.5"},
                    "attn_implementations": ["eager", "flash_attention_2", "flex_attention", "sdpa"]})
            else:
                service.stopped(s, GPU_WORKER)
            s.commit()
    finally:
        engine.dispose()


def _wait_for_a_worker(api) -> list[dict]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        up = [w for w in api.get("/api/workers").json() if not w["stopped_at"]]
        if up:
            return up
        time.sleep(0.5)
    raise TimeoutError("no worker reported within 60 s")


def test_workers_page_and_a_missing_kernel_refused(stack, api, corpus, pg_url):
    import sqlalchemy as sa

    plan = tiny_plan()
    plan["training"]["attn_implementation"] = "flash_attention_3"
    run = submit(api, plan, {"steps": 3, "data": {"path": str(corpus)}}, name="needs-fa3", approve=False)
    cpu = [w["name"] for w in _wait_for_a_worker(api) if w["gpu_count"] == 0]
    assert cpu  # the stack's real worker, CPU ranks: it would take any attention (running sdpa)
    # a GPU worker on the queue; the CPU worker is marked stopped meanwhile, so the GPU worker's kernels decide
    _gpu_worker(pg_url, up=True)
    engine = sa.create_engine(pg_url)
    with engine.begin() as c:
        c.execute(sa.text("UPDATE workers SET stopped_at = now() WHERE name = ANY(:n)"), {"n": cpu})
    try:
        with chromium_page(width=1500) as page:
            page.goto(f"{stack.url}/#/runs/{run['id']}")
            page.click(f"[data-testid=approve-{run['id']}]")
            err = page.locator(f"[data-testid=action-error-{run['id']}]")
            err.wait_for(timeout=20_000)
            assert ("flash_attention_3 is not installed on any gpu-h100-80gb worker (they have eager, "
                    "flash_attention_2, flex_attention, sdpa)") in err.inner_text()
            shot = screenshot(page, "dashboard-approval-missing-kernel")
            to_docs(shot, "approval-missing-kernel.png")
            page.goto(f"{stack.url}/#/workers")
            page.locator("[data-testid=worker-row]").first.wait_for(timeout=20_000)
            table = page.locator("[data-testid=workers-table]").inner_text()
            assert "NVIDIA H100 80GB HBM3" in table
            assert "no GPU (CPU ranks)" in table
            shot = screenshot(page, "dashboard-workers")
            to_docs(shot, "workers.png")
    finally:
        _gpu_worker(pg_url, up=False)
        with engine.begin() as c:
            c.execute(sa.text("UPDATE workers SET stopped_at = NULL WHERE name = ANY(:n)"), {"n": cpu})
        engine.dispose()
