"""Runs in Chromium against the real stack: submit from the planner, approve, watch the loss chart grow during a
real CPU run, cancel (queued and running), and the runs table at desktop and phone widths."""
import json
import re
import time
import uuid

import pytest

from tests.e2e.browser import chromium_page, screenshot
from tests.tiny import submit, tiny_plan, trainer_pids

pytestmark = pytest.mark.slow


def _state(page) -> str:
    return page.get_attribute("[data-testid=run-state]", "data-state")


def _points(page, testid="loss-chart") -> int:
    return int(page.get_attribute(f"[data-testid={testid}]", "data-points"))


def _fill_tiny_plan(page, sp_size=2):
    """The planner form filled with tests.tiny's plan: a tiny Llama config on sp_size CPU ranks."""
    plan = tiny_plan(sp_size=sp_size)
    page.check("[data-testid=model-mode-config]")
    page.fill("[data-testid=input-config]", json.dumps(plan["model"]["config"]))
    page.fill("[data-testid=input-gpus_per_node]", str(sp_size))
    page.fill("[data-testid=input-sp_size]", str(sp_size))
    page.fill("[data-testid=input-seq_len]", "512")
    page.fill("[data-testid=input-grad_accum]", "1")
    page.select_option("[data-testid=input-dtype]", "fp32")
    page.select_option("[data-testid=input-zero_stage]", "2")
    page.select_option("[data-testid=input-attn]", "sdpa")
    page.uncheck("[data-testid=input-offload_optimizer]")
    page.uncheck("[data-testid=input-activation_checkpointing]")


def test_submit_approve_and_watch_the_loss_chart_grow(api_server, api, corpus):
    name = f"ui-{uuid.uuid4().hex[:6]}"
    with chromium_page() as page:
        page.goto(f"{api_server}/#/planner")
        page.locator("[data-testid=planner-form]").wait_for(timeout=20_000)
        _fill_tiny_plan(page)
        page.fill("[data-testid=run-name]", name)
        page.fill("[data-testid=run-steps]", "40")
        page.fill("[data-testid=run-data]", str(corpus))
        page.wait_for_function("document.querySelector('[data-testid=planner-results]')?.dataset.state === 'valid'",
                               timeout=20_000)
        page.click("[data-testid=submit-run]")

        page.wait_for_url(re.compile(r".*#/runs/\d+$"), timeout=20_000)
        run_id = int(page.url.rsplit("/", 1)[1])
        page.locator("[data-testid=run-state]").wait_for(timeout=20_000)
        assert _state(page) == "pending_approval"
        stored = api.get(f"/api/runs/{run_id}").json()
        assert stored["name"] == name
        assert stored["spec"]["parallel"]["sp_size"] == 2
        assert stored["spec"]["run"]["data"]["path"] == str(corpus)

        page.click(f"[data-testid=approve-{run_id}]")
        # The page updates from the stream alone (no reload): first points while running, more later.
        page.wait_for_function("() => { const s = document.querySelector('[data-testid=run-state]')?.dataset.state;"
                               " const n = Number(document.querySelector('[data-testid=loss-chart]')?.dataset.points);"
                               " return s === 'running' && n >= 1; }", timeout=240_000)
        first = _points(page)
        page.wait_for_function("n => Number(document.querySelector('[data-testid=loss-chart]')?.dataset.points) > n",
                               arg=first, timeout=120_000)
        # the ETA, from the measured step times once they arrive (the planner's step time before), while it runs
        page.wait_for_function("() => { const e = document.querySelector('[data-testid=run-eta]');"
                               " return (e?.dataset.source === 'measured' && /\\d/.test(e.textContent ?? ''))"
                               " || document.querySelector('[data-testid=run-state]')?.dataset.state !== 'running'; }",
                               timeout=60_000)
        state, eta = page.evaluate("() => [document.querySelector('[data-testid=run-state]')?.dataset.state,"
                                   " document.querySelector('[data-testid=run-eta]')?.textContent]")
        if state == "running":  # read together: the run may end between two reads
            assert re.fullmatch(r"[\d.]+ (µs|ms|s)|\d+ min \d+ s", eta or ""), eta
        screenshot(page, "dashboard-run-live")
        page.wait_for_function("document.querySelector('[data-testid=run-state]')?.dataset.state === 'succeeded'",
                               timeout=300_000)
        # a finished run shows no stream status and no ETA
        assert page.locator("[data-testid=live-status]").count() == 0
        assert page.locator("[data-testid=run-eta]").count() == 0
        loss = api.get(f"/api/runs/{run_id}/metrics", params={"name": "loss"}).json()
        n = len(loss["series"][0]["step"])
        assert n >= 40 - 1
        page.wait_for_function("n => Number(document.querySelector('[data-testid=loss-chart]')?.dataset.points) === n",
                               arg=n, timeout=20_000)
        assert _points(page, "memory-chart") >= n  # one line per rank
        # a CPU run is labelled as CPU ranks, and the plan's H100 predictions are not drawn
        assert "CPU ranks × 2" in page.inner_text("[data-testid=run-device]")
        assert page.get_attribute("[data-testid=memory-chart-wrap]", "data-predicted-gib") == ""
        assert page.locator("[data-testid=planner-hidden-cpu]").is_visible()
        assert page.locator("[data-testid=run-predicted]").count() == 0
        # SP ranks hold equal shards, so rank 1's memory line lies on rank 0's at most steps; where it does (within
        # 1e-3 at more than half the steps) it is drawn dashed over it and labelled. The page's label is checked
        # against the series the API served: the two ranks' measured peaks differ by a 32-64 KiB tensor at some
        # measured steps, as gloo's thread frees the all-to-all buffers (seen on 1-2 of 6 measured steps a run).
        mem = {s["rank"]: dict(zip(s["step"], s["last"], strict=True)) for s in api.get(
            f"/api/runs/{run_id}/metrics", params={"name": "peak_allocated_gib", "points": 10_000}).json()["series"]}
        assert sorted(mem) == [0, 1]
        same = sum(abs(v - mem[0][k]) <= 1e-3 * max(abs(v), abs(mem[0][k])) for k, v in mem[1].items() if k in mem[0])
        equal = 2 * same > len(mem[1])
        print(f"rank 1 = rank 0 at {same}/{len(mem[1])} steps")
        assert page.get_attribute("[data-testid=memory-chart-wrap]", "data-equal-ranks") == ("1" if equal else "0")
        assert ("rank 1 (= rank 0 at" in page.inner_text("[data-testid=memory-chart-wrap]")) == equal
        screenshot(page, "dashboard-run-succeeded")


def test_cancel_a_running_run_from_its_page(api_server, api, corpus):
    run = submit(api, tiny_plan(sp_size=2), {"steps": 5000, "learning_rate": 1e-3, "seed": 0,
                                                    "data": {"path": str(corpus)}}, name="ui-cancel-running")
    with chromium_page() as page:
        page.goto(f"{api_server}/#/runs/{run['id']}")
        page.wait_for_function(
            "() => { const s = document.querySelector('[data-testid=run-state]')?.dataset.state;"
            " const n = Number(document.querySelector('[data-testid=loss-chart]')?.dataset.points);"
            " return (s === 'running' && n >= 2) || ['succeeded', 'failed', 'oom', 'cancelled', 'lost'].includes(s); }",
            timeout=240_000)
        assert _state(page) == "running", api.get(f"/api/runs/{run['id']}").json()
        assert len(trainer_pids(f"run-{run['id']}/")) >= 3, "torchrun and two ranks should be running"
        page.click(f"[data-testid=cancel-{run['id']}]")
        page.click(f"[data-testid=confirm-cancel-{run['id']}]")
        cancelled_at = time.monotonic()
        page.wait_for_function("document.querySelector('[data-testid=run-state]')?.dataset.state === 'cancelled'",
                               timeout=60_000)
        screenshot(page, "dashboard-run-cancelled")
        final = api.get(f"/api/runs/{run['id']}").json()
        assert final["state"] == "cancelled"
        assert final["exit_reason"] == "cancelled by request"
        while trainer_pids(f"run-{run['id']}/") and time.monotonic() - cancelled_at < 15:
            time.sleep(0.2)
        assert trainer_pids(f"run-{run['id']}/") == [], "trainer processes still alive 15 s after cancel"

        # An approver may retry it: the next attempt of the same run is queued, then cancelled again.
        page.click(f"[data-testid=retry-{run['id']}]")
        page.wait_for_function("['queued', 'starting', 'running'].includes("
                               "document.querySelector('[data-testid=run-state]')?.dataset.state)", timeout=20_000)
        assert api.get(f"/api/runs/{run['id']}").json()["attempt"] == 2
        page.click(f"[data-testid=cancel-{run['id']}]")
        page.click(f"[data-testid=confirm-cancel-{run['id']}]")
        page.wait_for_function("document.querySelector('[data-testid=run-state]')?.dataset.state === 'cancelled'",
                               timeout=60_000)


def test_runs_table_cancel_filter_and_widths(api_server, api, corpus):
    run = submit(api, tiny_plan(sp_size=2), {"steps": 5, "data": {"path": str(corpus)}},
                 name=f"ui-pending-{uuid.uuid4().hex[:6]}", approve=False)
    rid = run["id"]
    with chromium_page() as page:
        page.goto(f"{api_server}/#/runs")
        row = page.locator(f"[data-testid=run-row-{rid}]")
        row.wait_for(timeout=20_000)
        assert row.get_attribute("data-state") == "pending_approval"
        assert page.locator(f"[data-testid=approve-{rid}]").is_visible()

        # Filter by text and state narrows the table.
        page.fill("[data-testid=runs-filter-text]", run["name"])
        page.wait_for_function("() => document.querySelector('[data-testid=runs-table]')?.dataset.count === '1'",
                               timeout=10_000)
        page.fill("[data-testid=runs-filter-text]", "")
        page.select_option("[data-testid=runs-filter-state]", "succeeded")
        page.wait_for_function(f"() => !document.querySelector('[data-testid=run-row-{rid}]')", timeout=10_000)
        page.select_option("[data-testid=runs-filter-state]", "")
        row.wait_for(timeout=10_000)

        page.click(f"[data-testid=cancel-{rid}]")
        page.click(f"[data-testid=confirm-cancel-{rid}]")
        page.wait_for_function(
            f"() => document.querySelector('[data-testid=run-row-{rid}]')?.dataset.state === 'cancelled'",
            timeout=20_000)
        assert api.get(f"/api/runs/{rid}").json()["state"] == "cancelled"
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        screenshot(page, "dashboard-runs")

    with chromium_page(width=390, height=844) as page:
        page.goto(f"{api_server}/#/runs")
        page.locator(f"[data-testid=run-row-{rid}]").wait_for(timeout=20_000)
        time.sleep(0.5)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        assert page.locator(f"[data-testid=run-state-{rid}]").is_visible()
        screenshot(page, "dashboard-runs-phone")


def test_a_late_answer_for_an_old_filter_never_replaces_the_rows(api_server, api, corpus):
    """The runs table polls; an answer for the previous state filter that arrives after the current one must not swap
    the rows back (the row under the pointer would vanish for a moment: "element was detached from the DOM")."""
    run = submit(api, tiny_plan(sp_size=2), {"steps": 5, "data": {"path": str(corpus)}},
                 name=f"ui-late-{uuid.uuid4().hex[:6]}", approve=False)
    rid = run["id"]
    with chromium_page() as page:
        held = []  # the answers for the "succeeded" filter, held back until the next filter's rows are shown
        page.route(re.compile(r".*/api/runs\?state=succeeded.*"), lambda route: held.append(route))
        page.goto(f"{api_server}/#/runs")
        page.locator(f"[data-testid=run-row-{rid}]").wait_for(timeout=20_000)
        page.evaluate(f"""() => {{
          window.__vanished = 0;
          const gone = () => !document.querySelector('[data-testid=run-row-{rid}]');
          new MutationObserver(() => {{ if (gone()) window.__vanished++; }})
            .observe(document.querySelector('[data-testid=runs-table] tbody'), {{childList: true}});
        }}""")
        page.select_option("[data-testid=runs-filter-state]", "succeeded")
        page.wait_for_function(f"() => !document.querySelector('[data-testid=run-row-{rid}]')", timeout=10_000)
        page.select_option("[data-testid=runs-filter-state]", "")
        page.locator(f"[data-testid=run-row-{rid}]").wait_for(timeout=10_000)
        assert held, "the dashboard asked for the succeeded runs"
        for route in held:
            route.continue_()
        # the late answers are in once the page has received their responses
        page.wait_for_function("() => performance.getEntriesByType('resource')"
                               ".filter((e) => e.name.includes('state=succeeded') && e.responseEnd > 0).length"
                               f" >= {len(held)}", timeout=10_000)
        page.wait_for_timeout(300)  # React applies a resolved answer on the next task
        # The row is filtered out between the two selections at most once (React renders the "succeeded" filter
        # before the next answer), but never after the current filter's rows are shown.
        assert page.evaluate("window.__vanished") <= 1
        assert page.locator(f"[data-testid=run-row-{rid}]").is_visible()
    api.post(f"/api/runs/{rid}/cancel")


def test_an_unchanged_poll_keeps_each_row_and_its_buttons(api_server, api, corpus):
    """The runs table reads the list again every 2 s. A poll that answers the same run leaves its row's DOM as it is
    (the same <tr>, the same open "Yes, cancel" button, nothing inside changed), so the button under the pointer stays
    clickable: a fresh-clone make test once saw "Yes, cancel" detached from the DOM for 30 s."""
    run = submit(api, tiny_plan(sp_size=2), {"steps": 5, "data": {"path": str(corpus)}},
                 name=f"ui-stable-{uuid.uuid4().hex[:6]}", approve=False)  # pending: unchanged from poll to poll
    rid = run["id"]
    is_list = re.compile(r"/api/runs(\?[^/]*)?$")
    with chromium_page() as page:
        page.goto(f"{api_server}/#/runs")
        page.locator(f"[data-testid=run-row-{rid}]").wait_for(timeout=20_000)
        page.click(f"[data-testid=cancel-{rid}]")
        page.locator(f"[data-testid=confirm-cancel-{rid}]").wait_for(timeout=5_000)
        # Tag the row and the button a person is about to click, and count any change inside the row.
        page.evaluate("""(rid) => {
          const row = document.querySelector(`[data-testid=run-row-${rid}]`);
          row.dataset.tag = "kept";
          document.querySelector(`[data-testid=confirm-cancel-${rid}]`).dataset.tag = "kept";
          window.__changes = [];
          new MutationObserver((ms) => ms.forEach((m) => window.__changes.push(`${m.type} ${m.target.nodeName}`)))
            .observe(row, { subtree: true, childList: true, attributes: true, characterData: true });
        }""", rid)
        # Three more polls: by the third answer, the first two have long been drawn (they are 2 s apart).
        for _ in range(3):
            with page.expect_response(lambda r: bool(is_list.search(r.url)), timeout=10_000):
                pass
        kept = page.evaluate("""(rid) => ({
          row: document.querySelector(`[data-testid=run-row-${rid}]`)?.dataset.tag ?? null,
          button: document.querySelector(`[data-testid=confirm-cancel-${rid}]`)?.dataset.tag ?? null,
          changes: window.__changes,
        })""", rid)
        assert kept["row"] == "kept", "the row was re-created by a poll"
        assert kept["button"] == "kept", "the confirm button was re-created by a poll"
        assert kept["changes"] == [], kept["changes"]
        # The very button tagged before the polls is the one clicked.
        page.click(f"[data-testid=confirm-cancel-{rid}][data-tag=kept]", timeout=5_000)
        page.wait_for_function(
            f"() => document.querySelector('[data-testid=run-row-{rid}]')?.dataset.state === 'cancelled'",
            timeout=20_000)
    assert api.get(f"/api/runs/{rid}").json()["state"] == "cancelled"


def test_approving_a_run_that_does_not_fit_asks_for_force(api_server, api, corpus):
    plan = tiny_plan(sp_size=2)
    # A made-up GPU with 10 MiB: the planner says the tiny model does not fit, so approval needs force.
    plan["hardware"]["gpu"] = {"name": "tiny-gpu", "memory_gib": 0.1, "hbm_tb_per_s": 1, "bf16_dense_tflops": 10,
                               "nvlink_gb_per_s_per_direction": 10, "typical_internode_gb_per_s": 1}
    run = submit(api, plan, {"steps": 5, "data": {"path": str(corpus)}}, name="ui-does-not-fit", approve=False)
    rid = run["id"]
    assert run["estimate"]["memory"]["fits"] is False
    with chromium_page() as page:
        page.goto(f"{api_server}/#/runs/{rid}")
        page.click(f"[data-testid=approve-{rid}]")
        error = page.locator(f"[data-testid=action-error-{rid}]")
        error.wait_for(timeout=10_000)
        assert "GiB" in error.inner_text()
        # person-facing: it says what the button does, not an API parameter
        assert "Approve anyway" in error.inner_text()
        assert "force=true" not in error.inner_text()
        assert page.locator(f"[data-testid=approve-force-{rid}]").is_visible()
        assert page.get_attribute("[data-testid=run-state]", "data-state") == "pending_approval"
        screenshot(page, "dashboard-run-needs-force")
        page.click(f"[data-testid=cancel-{rid}]")  # cancel asks first; "Keep it" changes nothing
        page.locator(f"[data-testid=cancel-confirm-{rid}]").wait_for(timeout=5_000)
        page.click(f"[data-testid=keep-{rid}]")
        assert api.get(f"/api/runs/{rid}").json()["state"] == "pending_approval"
        page.click(f"[data-testid=cancel-{rid}]")
        page.click(f"[data-testid=confirm-cancel-{rid}]")
        page.wait_for_function("document.querySelector('[data-testid=run-state]')?.dataset.state === 'cancelled'",
                               timeout=20_000)
