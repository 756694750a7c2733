"""The stored plan is read through the plan model (`Run.plan`, `Claim.plan`, a `Plan` passed in), never as a raw
dict: `spec[...]`, `spec.get(...)` and `(spec or {}).get(...)` in backend/ and worker/ are counted (with Python's own
tokenizer, so comments and strings do not count) and only the places below may have them."""
from __future__ import annotations

import io
import tokenize
from collections import Counter
from pathlib import Path

from tests.boundaries import ROOT, source_files

# file -> (raw reads it may have, why)
ALLOWED: dict[str, tuple[int, str]] = {
    "backend/monitoring/collector.py": (1, "a database-side JSON expression (Run.spec['hardware']['gpu']), not a "
                                           "read in Python"),
    "backend/core/queue.py": (1, "gpu_name of a plan not validated yet: the user's file of `ulab plan "
                                 "--from-workers`, which may recommend a partial plan"),
    "backend/alerts/service.py": (1, "the stop rules at metric ingest, which never fails on a row whose plan does not "
                                  "validate: the rules fall back to the defaults"),
}


def raw_reads(source: str) -> list[int]:
    """The lines of `source` with a raw read of a name `spec`: `spec[`, `spec.get(`, `(spec or {}).get(`."""
    toks = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)]
    text = [t.string for t in toks]
    lines = []
    for i, tok in enumerate(toks):
        if tok.type != tokenize.NAME or tok.string != "spec":
            continue
        after = text[i + 1:i + 7]
        if after[:1] == ["["] or after[:3] == [".", "get", "("] or after == ["or", "{", "}", ")", ".", "get"]:
            lines.append(tok.start[0])
    return lines


def counts(files: list[Path]) -> Counter[str]:
    found: Counter[str] = Counter()
    for path in files:
        n = len(raw_reads(path.read_text()))
        if n:
            found[str(path.relative_to(ROOT))] = n
    return found


def test_raw_reads_of_the_stored_plan_are_only_the_allowed_ones():
    found = counts(list(source_files("backend", "worker")))
    extra = {f: n for f, n in found.items() if n > ALLOWED.get(f, (0, ""))[0]}
    assert not extra, (f"raw dict reads of a stored plan (read run.plan / Claim.plan / a Plan instead, or add the "
                       f"place to ALLOWED with its reason): {extra}")
    gone = {f: (n, found.get(f, 0)) for f, (n, _) in ALLOWED.items() if found.get(f, 0) < n}
    assert not gone, f"fewer raw reads than allowed (lower the count in ALLOWED): {gone}"


def test_the_counter_sees_each_form_and_skips_comments_and_strings():
    source = ("a = spec['run']\n"
              "b = run.spec.get('model')\n"
              "c = (run.spec or {}).get('parallel')\n"
              "# spec['run'] in a comment\n"
              "d = \"spec.get('x') in a string\"\n"
              "e = run.plan.run\n"
              "f = v.spec.model\n"
              "g = plan_spec['x']\n")
    assert raw_reads(source) == [1, 2, 3]


def test_the_scan_covers_the_files_that_had_raw_reads():
    names = {str(p.relative_to(ROOT)) for p in source_files("backend", "worker")}
    assert {"backend/inputs/paths.py", "backend/inputs/model_source.py", "backend/inputs/tokenizer_source.py",
            "backend/runs/service.py", "backend/core/queue.py", "worker/trackers.py"} <= names


def test_a_runs_ranks_come_from_its_validated_plan_and_an_unreadable_plan_still_shows_its_log():
    from backend.runs.models import Run
    from backend.runs.service import world_size
    from tests.tiny import tiny_plan

    assert world_size(Run(spec=tiny_plan(sp_size=2, dp_size=2))) == 4
    assert world_size(Run(spec={"parallel": {"sp_size": 2}})) == 1  # no model, hardware, training: not a plan
