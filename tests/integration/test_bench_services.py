"""The benches that start their own API on PostgreSQL and Redis run to the end with tiny settings (their figures
are read from full runs; a bench that no longer starts would otherwise go unnoticed, as `make test` does not call
them). Nothing about speed is asserted: only that every phase ran and printed its line with no request failing."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(*argv: str) -> str:
    out = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_load_bench_runs_its_three_phases():
    text = run_bench("bench/load.py", "--clients", "2", "--seconds", "0.5")
    phases = re.findall(r"^POST (/api/estimate, paced|/api/estimate|metrics x100) .* errors 0 ", text, re.M)
    assert phases == ["/api/estimate, paced", "/api/estimate", "metrics x100"], text


def test_metrics_query_bench_ingests_and_queries():
    text = run_bench("bench/metrics_query.py", "--points", "10000,20000", "--ingest", "10000", "--clients", "2",
                     "--seconds", "0.5", "--repeats", "3")
    assert re.search(r"^ingest through the API: 10,000 points .* 0 errors", text, re.M), text
    assert len(re.findall(r"^[\d,]+ points, chart query, .*: median [\d.]+ ms", text, re.M)) == 6, text
    assert len(re.findall(r"^2 clients: \d+ req/s, .* 0 errors", text, re.M)) == 2, text
    assert len(re.findall(r"^\| (10,000|20,000) \|", text, re.M)) == 2, text  # the table
