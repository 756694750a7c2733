"""Numbers a user can act on, in Chromium against the real API: one verdict (the import panel and the planner state
the server's words for the same plan), one formatter (no exponent, no "-105.5--3.5 GiB", a memory axis in its
unit, no "0" between the ticks of a log axis at 390 px; "262,144" and "256K" accepted) and Recommend's cards (the
same global batch on every card, its step time, tokens per step, time per billion tokens and kernels)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from plan import estimate, max_seq_len
from tests.e2e.browser import chromium_page, screenshot, to_docs
from tests.e2e.test_dashboard_verdict import VALID, link

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "imports"
# Llama-3.1-8B on 8 H100s with sp 4 x dp 2: at 256K short of memory at both ends of the band (15-131 GiB)
SHORT = {"model": {"preset": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8},
         "parallel": {"sp_size": 4, "dp_size": 2}, "training": {"seq_len": 131072}}
# the Recommend: Llama-3.1-8B at 128K on 4 x 8 H100, 8 sequences per optimizer step
LLAMA_128K = {"model": {"preset": "meta-llama/Llama-3.1-8B"},
              "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8, "num_nodes": 4},
              "parallel": {"sp_size": 32, "dp_size": 1}, "training": {"seq_len": 131072, "grad_accum": 8}}
EXPONENT = re.compile(r"\d(\.\d+)?e[+-]?\d")
# a step time and its range as the one formatter writes them (fmtSeconds, fmtRange): "step 11.6 s (11.1\u201312.4 s)"
# with one unit, "step 11.6 s (11.1 s \u2013 2 min 10 s)" when the ends are in different units
_UNIT = r"(?:\u00b5s|ms|s)"
_DURATION = rf"(?:[\d.,]+ {_UNIT}|\d+ min \d+ s|\d+ h \d+ min|\d+ d \d+ h)"
STEP_TIME = re.compile(rf"step {_DURATION} \((?:[\d.,]+\u2013[\d.,]+ {_UNIT}|{_DURATION} \u2013 {_DURATION})\)")


def _ticks(page, testid: str, axis: str) -> list[str]:
    return json.loads(page.get_attribute(f"[data-testid={testid}] .chart-plot", f"data-{axis}-ticks") or "[]")


def test_the_import_panel_and_the_planner_state_one_verdict(api_server, api):
    accelerate = (FIXTURES / "accelerate_sp.yaml").read_text()
    launch = (FIXTURES / "accelerate_sp_launch.txt").read_text().strip()
    first = api.post("/api/plans/import", json={"accelerate_config": accelerate, "launch": launch}).json()["plan"]
    # a length whose band straddles the card: the point fits, the high end does not
    launch = launch.replace("131072", str(max_seq_len(first)["likely"]))
    m = api.post("/api/plans/import", json={"accelerate_config": accelerate, "launch": launch}).json()["estimate"][
        "memory"]
    assert m["verdict"] == "tight", m
    with chromium_page(height=1400) as page:
        page.goto(f"{api_server}/#/planner")
        page.wait_for_function(VALID, timeout=20_000)
        page.click("[data-testid=import-setup] > summary")
        page.click("[data-testid=import-setup] details > summary")
        page.fill("[data-testid=import-accelerate]", accelerate)
        page.fill("[data-testid=import-launch]", launch)
        page.click("[data-testid=import-run]")
        page.locator("[data-testid=import-verdict]").wait_for(timeout=15_000)
        assert page.inner_text("[data-testid=import-verdict]") == m["verdict_text"]
        # the page's own starting plan may also read "may not fit": wait for the estimate of the loaded plan itself
        # (the form holds the imported seq_len and the results are no longer pending), not for its badge alone
        seq_before = page.input_value("[data-testid=input-seq_len]")
        page.click("[data-testid=import-load]")
        page.wait_for_function(f"{VALID} && document.querySelector('[data-testid=input-seq_len]').value !== "
                               f"{json.dumps(seq_before)} && document.querySelector('[data-testid=est-fits]')"
                               "?.innerText === 'may not fit'", timeout=20_000)
        assert page.inner_text("[data-testid=est-verdict]").startswith(m["verdict_text"])


def test_the_planner_reads_the_same_at_1280_and_390_px_light_and_dark(api_server):
    m = estimate({**SHORT, "training": {"seq_len": 262144}})["memory"]
    assert m["headroom_gib_range"][1] < 0, m          # short at both ends of the band
    for width in (1280, 390):
        for scheme in ("light", "dark"):
            with chromium_page(width=width, height=1800, color_scheme=scheme) as page:
                page.goto(link(api_server, SHORT))
                page.wait_for_function(VALID, timeout=20_000)
                page.fill("[data-testid=input-seq_len]", "262,144")          # as the page prints it
                page.wait_for_function(f"{VALID} && document.querySelector('[data-testid=est-headroom]')"
                                       "?.innerText.startsWith('short by')", timeout=20_000)
                assert "262,144 tokens (256K)" in page.inner_text("main")
                headroom = page.inner_text("[data-testid=est-headroom]")
                assert re.fullmatch(r"short by [\d.,]+\u2013[\d.,]+ (GiB|TiB)", headroom), headroom
                assert page.inner_text("[data-testid=est-verdict]").startswith(m["verdict_text"])
                step = page.inner_text("[data-testid=est-step-time-range]")
                assert not re.search(r"\d[kM] s", step), step                  # never "871.08-1.82k s"
                page.locator("[data-testid=sweep-chart] .chart-plot[data-x-ticks]").wait_for(timeout=20_000)
                x_ticks, y_ticks = _ticks(page, "sweep-chart", "x"), _ticks(page, "sweep-chart", "y")
                assert x_ticks, x_ticks
                assert "0" not in x_ticks, x_ticks                              # never "4K 0 16K 0 64K"
                assert all(re.fullmatch(r"\d+(\.\d+)?[KM]?", t) for t in x_ticks), x_ticks
                assert all(not EXPONENT.search(t) for t in y_ticks), y_ticks
                assert all(t == "0" or t.endswith("GiB") or t.endswith("TiB") for t in y_ticks), y_ticks
                text = page.inner_text("main")
                assert not EXPONENT.search(text), EXPONENT.search(text)
                assert "--" not in text
                assert page.evaluate("document.documentElement.scrollWidth") <= width + 1   # nothing overflows
                shot = screenshot(page, f"planner-numbers-{width}-{scheme}")
                to_docs(shot, f"planner-numbers-{width}-{scheme}.png")
                page.fill("[data-testid=input-seq_len]", "256K")
                page.wait_for_function(VALID, timeout=20_000)
                assert "262,144 tokens (256K)" in page.inner_text("main")


def test_recommend_cards_compare_like_with_like(api_server):
    for width in (1280, 390):
        with chromium_page(width=width, height=2400) as page:
            page.goto(link(api_server, LLAMA_128K))
            page.wait_for_function(VALID, timeout=20_000)
            page.click("[data-testid=recommend-run]")
            page.locator("[data-testid=recommendation-0]").wait_for(timeout=30_000)
            n = page.locator("[data-testid^=rec-batch-]").count()
            assert n >= 3, n
            for i in range(n):
                batch = page.locator(f"[data-testid=rec-batch-{i}]")
                assert batch.get_attribute("data-sequences") == "8"
                assert batch.get_attribute("data-tokens") == str(8 * 131072)
                assert "(8 sequences) per step" in batch.inner_text()
                step = page.inner_text(f"[data-testid=rec-step-{i}]")
                assert STEP_TIME.search(step), step
                assert "per billion tokens" in page.inner_text(f"[data-testid=rec-per-billion-{i}]")
                assert "flash_attention" in page.inner_text(f"[data-testid=rec-kernels-{i}]")
            assert "8 sequences per step" in page.inner_text("[data-testid=recommend-panel]")
            page.locator("[data-testid=recommendation-0]").scroll_into_view_if_needed()
            to_docs(screenshot(page, f"recommend-cards-{width}"), f"recommend-cards-{width}.png")
            page.check("[data-testid=recommend-vary-batch]")
            page.click("[data-testid=recommend-run]")
            page.wait_for_function("[...document.querySelectorAll('[data-testid^=rec-batch-]')]"
                                   ".some((e) => e.dataset.sequences !== '8')", timeout=30_000)
