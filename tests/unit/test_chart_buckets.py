"""The chart's bucket plan: within the point budget, W-aligned, W a multiple of the rollup tier it reads."""
import pytest

from backend.metrics.chart import TIERS, plan_buckets


@pytest.mark.parametrize("start, stop, points", [(1, 10, 1000), (1, 1000, 100), (1, 1_000_000, 1000),
                                                 (500_000, 600_000, 1000), (7, 99_991, 3), (0, 0, 1),
                                                 (123, 15_000_000, 800)])
def test_plan_respects_the_budget_and_the_tier(start, stop, points):
    width, tier = plan_buckets(start, stop, points)
    assert tier == 1 or tier in TIERS
    assert width % tier == 0
    assert stop // width - start // width + 1 <= points
    if tier > 1:  # the largest tier that fits: at most 16 rollup rows per bucket
        assert width // tier < 16 * 2 or tier == TIERS[-1]


def test_a_million_steps_at_1000_points_reads_rollups():
    width, tier = plan_buckets(1, 1_000_000, 1000)
    assert tier == 256
    assert width >= 1000
    assert (1_000_000 // tier) <= 16 * 1000
