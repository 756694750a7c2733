"""tests/longest_first.py, the plugin `make test` loads: the listed files are collected first, in the list's order,
the others after them as collected, and every listed file exists (a renamed file would silently drop out)."""
import subprocess
import sys
from pathlib import Path

from tests.longest_first import LONGEST_FIRST

ROOT = Path(__file__).resolve().parents[2]
FILES = ["tests/unit/test_boundaries.py", "tests/unit/test_chart_buckets.py", "tests/unit/test_plan_exports.py"]


def collected_files(*plugin: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", *plugin,
                          *FILES], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    files: list[str] = []
    for line in out.stdout.splitlines():
        if "::" in line and line.split("::", 1)[0] not in files:
            files.append(line.split("::", 1)[0])
    return files


def test_the_listed_files_come_first_and_the_rest_keep_their_order():
    assert "tests/unit/test_plan_exports.py" in LONGEST_FIRST
    assert collected_files() == FILES
    assert collected_files("-p", "tests.longest_first") == [FILES[2], FILES[0], FILES[1]]


def test_every_listed_file_exists_once():
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    assert [p for p in LONGEST_FIRST if not (ROOT / p).is_file()] == []
