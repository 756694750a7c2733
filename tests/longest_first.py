"""pytest plugin of `make test` (`-p tests.longest_first --no-loadscope-reorder`): the longest test files first.

`make test` runs two pytest-xdist processes taking whole files (--dist loadfile). xdist's own queue puts the files
with the most tests first, which leaves the long files (one to four tests each: a trained run, a browser, a fault
injected into a stack of their own) for the end; and a process takes its next file while it still has 2 tests or
fewer to run, so at the tail one process can hold two or three long files while the other has nothing left.
Longest first, the short unit and API files fill the end instead (bench/suite_durations.py simulates both queues
from a JUnit report; bench/suite_durations.py prints them). Files not listed keep their collection order after these.

The list is ordered by the durations measured per file (bench/suite_durations.py); refresh it from `var/junit.xml`,
which
`make test` writes, with `python bench/suite_durations.py var/junit.xml`."""
from __future__ import annotations

import pytest

LONGEST_FIRST = [
    "tests/e2e/test_dashboard_divergence.py",
    "tests/integration/test_faults.py",
    "tests/e2e/test_dashboard_probe.py",
    "tests/integration/test_probe.py",
    "tests/integration/test_slurm.py",
    "tests/e2e/test_dashboard_submit_run_fields.py",
    "tests/e2e/test_dashboard_compare.py",
    "tests/integration/test_supervision.py",
    "tests/e2e/test_run_page.py",
    "tests/e2e/test_dashboard_advice.py",
    "tests/integration/test_trainer_runs.py",
    "tests/integration/test_exports_run.py",
    "tests/integration/test_trainer_resume.py",
    "tests/integration/test_trainer_features.py",
    "tests/e2e/test_dashboard_runs.py",
    "tests/e2e/test_dashboard_headers.py",
    "tests/unit/test_plan_exports.py",
]


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A stable sort: the listed files in the list's order, then every other file as collected (trylast: after
    any plugin that shuffles), each file's tests in their own order."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(file_of(item.nodeid), len(rank)))
