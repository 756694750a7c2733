"""`ulab plan --text`: the estimate for people, with the same figures as the JSON."""
import json
import subprocess
import sys
from pathlib import Path

from plan import estimate, max_seq_len
from plan.report import text_report
from tests.plans import qwen_plan

ULAB = Path(sys.executable).parent / "ulab"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3-4b-64k.json"


def ulab_plan(path: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ULAB), "plan", "--json", str(path), *flags], capture_output=True, text=True,
                          timeout=120)


def test_text_gives_the_json_figures():
    as_json, as_text = ulab_plan(EXAMPLE), ulab_plan(EXAMPLE, "--text")
    assert as_json.returncode == as_text.returncode == 0, as_text.stderr
    est, text = json.loads(as_json.stdout), as_text.stdout
    m, t = est["memory"], est["throughput"]
    assert f"{m['peak_allocated_gib']:.2f} GiB allocated" in text
    assert f"{m['device_total_gib']:.2f} GiB device total of 80 GiB" in text
    lo, hi = m["device_total_gib_range"]
    # the offload regime's band (ALST paper and the H100 check) reaches past 80 GiB at its high end
    assert m["verdict"] == "tight"
    assert f"may not fit: {lo:.0f}\u2013{hi:.0f} GiB of 80" in text
    slo, shi = t["step_time_s_range"]
    assert f"range: {slo:.4g}\u2013{shi:.4g} s per step" in text
    assert f"{m['cpu_gib_per_node']:.1f} GiB of 1900 GiB: fits" in text
    assert f"MFU {100 * t['mfu']:.1f}%" in text
    assert f"{t['tflops_per_gpu']:.1f} TFLOPS" in text
    for part, gib in m["breakdown_gib"].items():  # every non-zero part, by name
        assert (f"{part.replace('_', ' ')} {gib:.3g} GiB" in text) == (gib != 0), part
    assert "warning: training.seq_len" in text  # 64K is past Qwen3-4B's 40,960 positions


def test_text_of_a_max_context_search_states_the_length_it_found():
    as_json, as_text = ulab_plan(EXAMPLE, "--max-seq"), ulab_plan(EXAMPLE, "--max-seq", "--text")
    ans = json.loads(as_json.stdout)
    n, likely = ans["max_seq_len"], ans["likely"]
    assert n == ans["safe"]
    assert 0 < n < likely
    assert f"longest seq_len that fits: {n:,} tokens (the range's high end fits), {likely:,} likely" in as_text.stdout
    assert f"seq_len {n:,}," in as_text.stdout  # the header describes the estimate shown, at that length


def test_text_names_each_broken_field_and_exits_1(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(qwen_plan(seq_len=32770)))  # not a multiple of sp_size 4
    r = ulab_plan(bad, "--text")
    assert r.returncode == 1
    assert r.stdout.startswith("not a valid plan:")
    assert "training.seq_len:" in r.stdout


def test_text_says_when_a_plan_does_not_fit_or_may_not():
    for seq, verdict, words in ((1 << 20, "does_not_fit", "does not fit: "), (max_seq_len(qwen_plan())["likely"],
                                                                             "tight", "may not fit: ")):
        plan = qwen_plan(seq_len=seq)
        est = estimate(plan)
        m = est["memory"]
        assert m["verdict"] == verdict
        assert not m["fits"]
        lo, hi = m["device_total_gib_range"]
        assert m["verdict_text"] == f"{words}{lo:,.0f}\u2013{hi:,.0f} GiB of 80"  # the one verdict (plan/verdict.py)
        assert m["verdict_text"] in text_report(plan, est)


def test_text_describes_the_plan_with_the_defaults_it_was_estimated_with():
    plan = {"model": {"preset": "Qwen/Qwen3-4B"}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 4},
            "parallel": {"sp_size": 4}, "training": {"seq_len": 32768}}
    text = text_report(plan, estimate(plan))
    assert "sp 4 x dp 1, seq_len 32,768, bf16, ZeRO-3, activation checkpointing" in text.splitlines()[0]
