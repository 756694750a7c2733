"""Metric ingest and the chart query on SQLite (the embedded default), against Python over the raw points."""
import pytest

from backend.core import db
from backend.metrics import chart, service
from backend.metrics.schemas import PointIn


@pytest.fixture
def session(sqlite_db):
    from backend.plans.models import Plan
    from backend.runs.models import Run

    with db.get_sessionmaker()() as s:
        s.add(Plan(name="p", spec={}, estimate={}))
        s.flush()
        s.add(Run(name="r", plan_id=1, state="running", spec={}))
        s.commit()
        yield s


def test_rollups_and_raw_edges_give_the_buckets_python_gives(session):
    values = {s: ((s * 7919) % 1000) / 10.0 for s in range(1, 20001)}
    pts = [PointIn(rank=r, step=s, name="loss", value=v + r) for s, v in values.items() for r in (0, 1)]
    assert service.ingest(session, 1, pts[:25000]) == 25000
    assert service.ingest(session, 1, pts[20000:]) == 20000  # overlapping resend
    # 37 and 100 buckets read tier-256 blocks with tier-16 edges, 4 and 3 buckets tier-4096 with tier-256 edges
    for start, stop, budget in [(1, 20000, 1000), (1, 20000, 37), (4999, 15001, 100), (5, 40, 1000), (1, 20000, 4),
                                (333, 19777, 3)]:
        width, _ = chart.plan_buckets(start, stop, budget)
        out = chart.query(session, 1, "loss", start, stop, budget)
        assert [s.rank for s in out.series] == [0, 1]
        for s in out.series:
            expected: dict[int, list] = {}
            for step in range(start, stop + 1):
                v = values[step] + s.rank
                b = expected.setdefault(step // width, [step, v, v, v])
                b[0], b[1], b[2], b[3] = step, min(b[1], v), max(b[2], v), v
            assert list(zip(s.step, s.min, s.max, s.last)) == [tuple(b) for _, b in sorted(expected.items())]
            assert len(s.step) <= budget


def test_a_rewritten_point_updates_the_value_and_the_rollup_keeps_both_extremes(session):
    # a resumed attempt redoes steps 5..16 with other values: the points take the new values, the 16-step block
    # keeps the min/max of everything it has seen and its `last` follows the latest step
    service.ingest(session, 1, [PointIn(rank=0, step=s, name="loss", value=float(s)) for s in range(1, 17)])
    service.ingest(session, 1, [PointIn(rank=0, step=s, name="loss", value=100.0 + s) for s in range(5, 17)])
    rows = dict(session.execute(service.text("SELECT step, value FROM metrics ORDER BY step")).all())
    assert rows[4] == 4.0
    assert rows[5] == 105.0
    assert rows[16] == 116.0
    block = session.execute(service.text(
        "SELECT vmin, vmax, last_step, last_value FROM metric_rollups WHERE tier = 16 AND bucket = 1")).one()
    assert tuple(block) == (16.0, 116.0, 16, 116.0)
    first = session.execute(service.text(
        "SELECT vmin, vmax, last_step, last_value FROM metric_rollups WHERE tier = 16 AND bucket = 0")).one()
    assert tuple(first) == (1.0, 115.0, 15, 115.0)
