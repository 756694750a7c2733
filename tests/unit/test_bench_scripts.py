"""The planner benches run to the end and print their figures (they are how the targets are read; a bench
that no longer runs would go unnoticed, since `make test` does not otherwise call them). No figure is asserted:
speed and accuracy are printed, not tested here."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(name: str, *args: str) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / name), *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_planner_accuracy_prints_every_published_row_and_the_worst_errors():
    text = run_bench("planner_accuracy.py")
    # One table line per CSV row (7 rows), read as the CSV states.
    assert len(re.findall(r"^\s+\d+\s+\d+\s+\d+\s+\d+ \|", text, re.M)) == 7
    assert re.search(r"^SP rows, memory within 10%: \d+/5 figures; worst [+-]\d+\.\d%", text, re.M)
    assert re.search(r"^tokens/s between whole-length and 512-token documents: \d+/8 published figures", text, re.M)
    assert re.search(r"^128K row predicted not to fit on 80 GB: (True|False)$", text, re.M)
    # The ALST comparison prints one line per published figure.
    assert len(re.findall(r"^\s+(1|8|32) \|\s+[\d,]+ vs\s+[\d,]+", text, re.M)) == 3
    assert text.rstrip().splitlines()[-1].startswith("worst SP-row memory error")


def test_planner_speed_prints_medians_against_the_targets():
    text = run_bench("planner_speed.py")
    assert len(re.findall(r"^estimate .* median\s+[\d.]+ ms .* target <= 2 ms: (OK|MISSED)", text, re.M)) >= 2
    assert len(re.findall(r"^max-context search .* median\s+[\d.]+ ms .* target <= 50 ms: (OK|MISSED)", text,
                          re.M)) >= 2


def test_recommend_prints_the_top_3_for_every_scenario_and_the_time_per_call():
    text = run_bench("recommend.py")
    headers = re.findall(r"^== .*: [\d.]+ ms per call \(median of \d+\), \d+ GPUs ==$", text, re.M)
    assert len(headers) >= 6
    assert any("512K on 32 x H100" in h for h in headers)
    assert len(re.findall(r"^  [123]\. sp\d+ dp\d+ z\d", text, re.M)) >= 3 * 6
    assert re.search(r"^recommend for 64 GPUs: worst median [\d.]+ ms per call, target <= 200 ms: (OK|MISSED)$",
                     text, re.M)


def test_system_metrics_prints_the_cost_of_a_read_and_its_share_of_a_step():
    text = run_bench("system_metrics.py")
    assert re.search(r"^system sample, psutil (only|\+ NVML).*: [\d.]+ us per read; reused between reads: [\d.]+ us",
                     text, re.M), text
    assert len(re.findall(r"^\s+[\d.]+ s \|\s+[\d.]+ us \| [\d.]+%$", text, re.M)) == 4, text
    assert re.search(r"^largest share of training time: [\d.]+% \(budget 1%: (OK|MISSED)\)$", text, re.M), text


def test_planner_validation_prints_every_corpus_row_and_a_summary_per_regime():
    text = run_bench("planner_validation.py")
    from bench.corpus import read_corpus
    for row in read_corpus():
        assert re.search(rf"^  {re.escape(row['id'])}\s+published", text, re.M), row["id"]
    for regime in ("ulysses", "offload", "ring", "packed", "all"):
        assert re.search(rf"^{regime}\s+rows\s+\d+ \(\+\d+ flagged\) \| within 15%: \d+/\d+", text, re.M), regime
    assert re.search(r"^  within 15%: \d+/\d+ \(\d+%\); worst \S+ [+-][\d.]+%$", text, re.M), text
    assert run_bench("planner_bands.py", "--check").rstrip().endswith("committed table is up to date")


def test_corpus_consistency_prints_every_pair_and_the_fp32_buffer_what_if():
    from bench.corpus import read_corpus
    from bench.corpus_consistency import pairs

    text = run_bench("corpus_consistency.py")
    floors = re.findall(r"^  the best one estimate can do on both: worst error \d+\.\d%( -> both flagged)?$", text,
                        re.M)
    assert len(floors) == len(pairs({r["id"]: r for r in read_corpus()}))
    what_if = run_bench("corpus_consistency.py", "--without-fp32-grad-buffer")
    rows = re.findall(r"^  (\S+) +published +[\d.]+ +planner +[\d.]+ \( *[+-][\d.]+%\) +without +[\d.]+", what_if, re.M)
    assert "HF-4g-sp4-32K-mem" in rows
    assert len(rows) == sum(1 for r in read_corpus() if r["regime"] == "ulysses"
                            and r["quantity"] in ("reserved", "allocated"))


def test_packed_attention_prints_a_row_per_method():
    text = run_bench("packed_attention.py", "--seq", "256", "--steps", "2")
    for method in ("loop", "buckets", "padded", "dense-mask"):
        assert re.search(rf"^{method}\s+\|\s+\d+ \|\s+[\d.]+ \|\s+[\d.]+ \|\s+[\d.e+-]+$", text, re.M), (method, text)
    assert re.search(r"^padded\s+\|\s+1 \|", text, re.M), text  # the trainer's: one call
    for method in ("flex", "nested"):  # no CPU backward / no causal nested path in this torch: said, not hidden
        assert re.search(rf"^{method}\s+\| (cannot train here: .+|\s*\d+ \|.*)$", text, re.M), (method, text)


def test_time_misses_prints_every_offload_row_t9_against_t1_and_the_hf_steps():
    from bench.time_misses import HF_ROWS, OFFLOAD_ROWS

    text = run_bench("time_misses.py")
    for rid in OFFLOAD_ROWS:
        assert re.search(rf"^  {re.escape(rid)}\s+published .* planner .*\([+-][\d.]+%\)  all cores .*\([+-][\d.]+%\)$",
                         text, re.M), rid
    assert re.search(r"^  the best one estimate that grows with the work can do on both: worst error \d+\.\d%$", text,
                     re.M)
    assert len(re.findall(r"^  attention at 0\.\d\d of peak: T1 [+-][\d.]+%, T9 [+-][\d.]+%$", text, re.M)) == 2
    for rid in HF_ROWS:
        assert re.search(rf"^  {rid}\s+[\d,]+ tokens per step at .* s per step; planner", text, re.M), rid


def test_allocator_replay_prints_the_measured_replayed_and_planner_ratios_of_a_row():
    text = run_bench("allocator_replay.py", "--rows", "suite-zero2", "--steps", "1")
    assert re.search(r"^row\s+alloc\s+reserved .* replay ratio\s+planner gap\s+planner ratio$", text, re.M)
    assert re.search(r"^suite-zero2\s+\d+\.\d\d\s+\d+\.\d\d\s+\d+\.\d\d\s+1\.\d{3}(\s+\d+\.\d\d){3}\s+1\.\d{3}"
                     r"\s+\d+\.\d\d\s+1\.\d{3}$", text, re.M)
