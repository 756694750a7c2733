"""bench/suite_durations.py: per-file seconds from JUnit reports and the simulated two-process schedule of
`--dist loadfile`, on a report whose figures are worked out by hand here."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# file: test seconds. Collected order a, b, c, d; d is the longest file, and collected (and sorted by count) last.
CASES = {"a": [1.0] * 6, "b": [2.0] * 3, "c": [3.0] * 3, "d": [20.0] * 3}

def report(path: Path, files: dict[str, list[float]]) -> Path:
    cases = "".join(f'<testcase classname="tests.unit.test_{f}" name="test_{i}" time="{s}"/>'
                    for f, times in files.items() for i, s in enumerate(times))
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return path


def run(*args: str) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "suite_durations.py"), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_seconds_per_file_and_the_two_process_schedules(tmp_path):
    text = run(str(report(tmp_path / "r.xml", CASES)), "--top", "2")
    assert text.splitlines()[0] == "15 tests in 4 files: 81.0 s summed"
    rows = re.findall(r"^\s+([\d.]+)\s+(\d+)  (tests/unit/test_\w+\.py)$", text, re.M)
    assert rows == [("60.0", "3", "tests/unit/test_d.py"), ("9.0", "3", "tests/unit/test_c.py"),
                    ("6.0", "6", "tests/unit/test_a.py"), ("6.0", "3", "tests/unit/test_b.py")]  # ties: as collected
    assert re.findall(r"^\s+([\d.]+)  (\S+)$", text, re.M) == [
        ("20.0", "tests/unit/test_d.py::test_2"), ("20.0", "tests/unit/test_d.py::test_1")]
    # a (6 tests) and b start; at 2 s b has 2 left and takes c; at 4 s a has 2 left and takes d, which then runs
    # after a's last two tests (4 + 2 + 60 = 66) while the other process ends c at 15 s
    assert "xdist default (most tests first): 66.0 s; last files: process 0: tests/unit/test_d.py" in text
    assert "as collected (--no-loadscope-reorder): 66.0 s" in text
    # d and c start; c's process takes a at 3 s and b at 13 s, done at 21 s; d's ends at 60
    assert "longest first: 60.0 s; last files: process 0: tests/unit/test_d.py; process 1: tests/unit/test_b.py" \
        in text
    assert "lower bound (summed / 2, or the longest file): 60.0 s" in text


def test_reports_add_up_and_one_process_takes_the_sum(tmp_path):
    one = report(tmp_path / "one.xml", {"a": CASES["a"], "d": CASES["d"]})
    two = report(tmp_path / "two.xml", {"c": CASES["c"], "a": [1.0]})
    text = run(str(one), str(two), "--jobs", "1")
    assert text.splitlines()[0] == "13 tests in 3 files: 76.0 s summed"
    assert re.search(r"^\s+7\.0\s+7  tests/unit/test_a\.py$", text, re.M)
    assert "as collected (--no-loadscope-reorder): 76.0 s" in text


def test_jobs_below_one_is_an_error_naming_it(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "suite_durations.py"),
                          str(report(tmp_path / "r.xml", CASES)), "--jobs", "0"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0
    assert "jobs: must be at least 1, got 0" in out.stderr
