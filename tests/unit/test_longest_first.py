"""tests/longest_first.py, the plugin `make test` loads: the listed files are collected first, in the list's order,
the others after them as collected, and every listed file exists (a renamed file would silently drop out)."""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.longest_first import LONGEST_FIRST, pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parents[2]


def test_the_listed_files_come_first_in_the_lists_order_and_the_rest_keep_theirs():
    ids = ["tests/unit/test_b.py::test_1", f"{LONGEST_FIRST[1]}::test_x", "tests/unit/test_a.py::test_2",
           f"{LONGEST_FIRST[0]}::test_y", f"{LONGEST_FIRST[1]}::test_w", "tests/unit/test_b.py::test_0"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [ids[3], ids[1], ids[4], ids[0], ids[2], ids[5]]


def test_make_tests_plugin_option_loads_it():
    """As `make test` loads it (-p tests.longest_first): test_dashboard_headers.py, listed, is collected first."""
    files = ["tests/e2e/test_dashboard_access.py", "tests/e2e/test_dashboard_headers.py"]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--noconftest", "-p", "no:randomly",
                          "-p", "tests.longest_first", *files], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert ids, ids
    assert ids[0].startswith(files[1]), ids
    assert ids[-1].startswith(files[0]), ids


def test_every_listed_file_exists_once():
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    assert [p for p in LONGEST_FIRST if not (ROOT / p).is_file()] == []
