"""Where `make test`'s pytest time goes, from JUnit XML reports (`pytest --junitxml=FILE`; each test case's time is
its setup, call and teardown, pytest's default `junit_duration_report = total`): seconds per file, the slowest
tests, and the wall time two pytest-xdist processes would take with `--dist loadfile` (whole files per process).

The schedule is simulated as xdist's LoadScopeScheduling hands files out: the queue in collection order, sorted by
number of tests, most first (`--loadscope-reorder`, xdist's default), or kept as collected
(`--no-loadscope-reorder`), or longest file first; a process takes the next file while it has 2 tests or fewer
left to run (makespan below). Figures are only as good as the reports: durations measured on a loaded machine
add up to more than an idle machine's, and files measured in separate runs each paid their own process start.

    python bench/suite_durations.py report1.xml [report2.xml ...] [--jobs 2] [--top 30]
"""
from __future__ import annotations

import argparse
import heapq
import xml.etree.ElementTree as ET
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class FileTime:
    path: str
    seconds: float = 0.0
    tests: list[tuple[str, float]] = field(default_factory=list)


def file_of(classname: str, file_attr: str | None) -> str:
    """JUnit's classname is the dotted module path (plus a class, if any): tests.unit.test_x[.TestY]."""
    if file_attr:
        return file_attr
    parts = classname.split(".")
    while parts and not parts[-1].startswith("test_"):
        parts.pop()
    return "/".join(parts) + ".py" if parts else classname


def read_reports(paths: list[Path]) -> dict[str, FileTime]:
    """Per file, in the order files first appear (the collection order of the first report naming them)."""
    files: dict[str, FileTime] = {}
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            name = file_of(case.get("classname", ""), case.get("file"))
            ft = files.setdefault(name, FileTime(name))
            seconds = float(case.get("time", "0") or 0)
            ft.seconds += seconds
            ft.tests.append((case.get("name", "?"), seconds))
    return files


def makespan(queue: list[FileTime], jobs: int) -> tuple[float, list[list[str]]]:
    """xdist's LoadScopeScheduling, test by test: each process starts with one file of the queue and takes one more
    at once if that leaves it 2 tests or fewer; after each test it ends, a process with 2 tests or fewer still to
    run takes the next file (xdist's `_reschedule`). So a process may hold files that the other, idle, would have
    run: the tail of the queue matters."""
    if jobs < 1:
        raise ValueError(f"jobs: must be at least 1, got {jobs}")
    todo = deque(queue)
    pending: list[deque[float]] = [deque() for _ in range(jobs)]
    taken: list[list[str]] = [[] for _ in range(jobs)]

    def assign(j: int) -> None:
        if todo:
            ft = todo.popleft()
            taken[j].append(ft.path)
            pending[j].extend(s for _, s in ft.tests)

    for j in range(jobs):
        assign(j)
    for j in range(jobs):
        if len(pending[j]) <= 2:
            assign(j)
    running = [(pending[j][0], j) for j in range(jobs) if pending[j]]
    heapq.heapify(running)
    end = 0.0
    while running:
        now, j = heapq.heappop(running)
        end = max(end, now)
        pending[j].popleft()
        if len(pending[j]) <= 2:
            assign(j)
        if pending[j]:
            heapq.heappush(running, (now + pending[j][0], j))
    return end, taken


def orders(files: dict[str, FileTime]) -> dict[str, list[FileTime]]:
    collected = list(files.values())
    return {
        "xdist default (most tests first)": sorted(collected, key=lambda f: -len(f.tests)),
        "as collected (--no-loadscope-reorder)": collected,
        "longest first": sorted(collected, key=lambda f: -f.seconds),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    files = read_reports(args.reports)
    total = sum(f.seconds for f in files.values())
    count = sum(len(f.tests) for f in files.values())
    print(f"{count} tests in {len(files)} files: {total:.1f} s summed")
    print(f"{'seconds':>8} {'tests':>5}  file")
    for f in sorted(files.values(), key=lambda f: -f.seconds):
        print(f"{f.seconds:8.1f} {len(f.tests):5d}  {f.path}")
    print(f"\nslowest {args.top} tests")
    tests = sorted(((s, f"{f.path}::{n}") for f in files.values() for n, s in f.tests), reverse=True)
    for s, name in tests[:args.top]:
        print(f"{s:8.1f}  {name}")
    print(f"\n{args.jobs} processes, whole files each (--dist loadfile), simulated:")
    for label, queue in orders(files).items():
        span, taken = makespan(queue, args.jobs)
        print(f"  {label}: {span:.1f} s; last files: "
              + "; ".join(f"process {j}: {t[-1] if t else '-'}" for j, t in enumerate(taken)))
    print(f"  lower bound (summed / {args.jobs}, or the longest file): "
          f"{max(total / args.jobs, max((f.seconds for f in files.values()), default=0.0)):.1f} s")


if __name__ == "__main__":
    main()
