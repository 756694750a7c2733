"""The run cost's one-line summary (plan/cost.py `summary`): the estimate and its range in one readable unit, so
they compare at a glance, as the dashboard's ranges do (frontend/src/lib/format.ts fmtRange)."""
from plan.cost import duration_text, summary

H, D = 3600.0, 86400.0


def test_a_range_that_crosses_100_hours_is_written_in_days_throughout():
    # was "about 100 h (88 h to 7.7 d)": two units in one range, and the estimate in a third's terms
    assert summary(99.6 * H, [88 * H, 185 * H], 3198.4) == "about 4.2 d (3.7-7.7 d), 3,198 GPU-hours"


def test_a_range_within_one_unit_reads_as_before():
    assert summary(41 * H, [35 * H, 52 * H], 1312) == "about 41 h (35-52 h), 1,312 GPU-hours"
    assert summary(25 * 60, [20 * 60, 40 * 60], 0.83) == "about 25 min (20-40 min), 0.83 GPU-hours"


def test_a_short_low_end_is_written_in_the_high_ends_unit():
    assert summary(50 * 60, [40 * 60, 2 * H], 4) == "about 0.83 h (0.67-2 h), 4 GPU-hours"


def test_durations_pick_their_own_unit():
    assert [duration_text(x) for x in (40, 25 * 60, 7.5 * H, 41 * H, 120 * H, 12 * D)] == \
        ["40 s", "25 min", "7.5 h", "41 h", "5 d", "12 d"]
