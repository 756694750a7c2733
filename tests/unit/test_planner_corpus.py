"""The planner against its validation corpus (bench/data/published_corpus.csv, issue 23): no change may silently make
a published row worse. Each row's |error| is held to the bound stored in bench/data/corpus_error_bounds.csv (written by
`bench/planner_validation.py --write-bounds`), and a row its stated range covered stays covered. The uncertainty
bands the planner reads must be the ones bench/planner_bands.py computes from the corpus."""
import csv

import pytest

from bench.corpus import evaluate_all, read_corpus
from bench.planner_bands import compute, render
from bench.planner_validation import BOUNDS
from plan.uncertainty import BANDS_CSV

# Rounding of the printed predictions and float noise; a real regression moves a row by more.
TOLERANCE = 0.005


def _bounds() -> dict[str, dict]:
    with open(BOUNDS, newline="") as f:
        return {r["id"]: r for r in csv.DictReader(line for line in f if not line.startswith("#"))}


RESULTS = {r.row["id"]: r for r in evaluate_all()}


def test_every_corpus_row_has_a_bound():
    assert set(_bounds()) == {r["id"] for r in read_corpus()}


@pytest.mark.parametrize("row_id", sorted(RESULTS))
def test_corpus_row_no_worse_than_its_bound(row_id):
    res, bound = RESULTS[row_id], _bounds()[row_id]
    if bound["abs_error"]:
        assert abs(res.error) <= float(bound["abs_error"]) + TOLERANCE, (row_id, res.error, bound["abs_error"])
    if bound["covered"] == "1":
        assert res.covered, (row_id, res.band, res.row["published"])


def test_the_committed_bands_are_the_corpus_bands():
    assert BANDS_CSV.read_text() == render(compute())
