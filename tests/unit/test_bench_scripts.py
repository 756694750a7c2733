"""The planner benches run to the end and print their figures (they are how issue 3's targets are read; a bench
that no longer runs would go unnoticed, since `make test` does not otherwise call them). No figure is asserted:
speed and accuracy are printed, not tested here."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(name: str) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / name)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_planner_accuracy_prints_every_published_row_and_the_worst_errors():
    text = run_bench("planner_accuracy.py")
    # One table line per CSV row, in both readings (7 rows each).
    assert len(re.findall(r"^\s+\d+\s+\d+\s+\d+\s+\d+ \|", text, re.M)) == 14
    assert re.search(r"^memory within 10%: \d+/7 figures; worst [+-]\d+\.\d%", text, re.M)
    assert re.search(r"^tokens/s within 25%: \d+/8 figures", text, re.M)
    assert re.search(r"^128K row predicted not to fit on 80 GB: (True|False)$", text, re.M)
    # The ALST comparison and the missing-term check print one line per published figure / per term form.
    assert len(re.findall(r"^\s+(1|8|32) \|\s+[\d,]+ vs\s+[\d,]+", text, re.M)) == 3
    assert len(re.findall(r"^\s+(constant per GPU|bytes/param on every GPU|bytes/param over the ZeRO group): ",
                          text, re.M)) == 3
    assert text.rstrip().splitlines()[-1].startswith("worst tokens/s error")


def test_planner_speed_prints_medians_against_the_targets():
    text = run_bench("planner_speed.py")
    assert len(re.findall(r"^estimate .* median\s+[\d.]+ ms .* target <= 2 ms: (OK|MISSED)", text, re.M)) >= 2
    assert len(re.findall(r"^max-context search .* median\s+[\d.]+ ms .* target <= 50 ms: (OK|MISSED)", text,
                          re.M)) >= 2
