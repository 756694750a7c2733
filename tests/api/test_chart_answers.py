"""The chart query's cached answers (backend/metrics/chart.py) never hide an ingest made through this API process:
the next chart has the new points."""
from __future__ import annotations

from tests.api.conftest import as_role
from tests.api.test_alerts import ingest, loss_points, running_run


def test_a_chart_after_an_ingest_has_the_new_points(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path)

    def chart() -> list[int]:
        r = client.get(f"/api/runs/{run_id}/metrics", params={"name": "loss", "points": 100}, headers=admin)
        assert r.status_code == 200, r.text
        return r.json()["series"][0]["step"] if r.json()["series"] else []

    assert chart() == []
    ingest(client, admin, run_id, loss_points({1: 5.0, 2: 4.0, 3: 3.0}))
    assert chart() == [1, 2, 3]
    assert chart() == [1, 2, 3]  # served again
    ingest(client, admin, run_id, loss_points({4: 2.5, 5: 2.0}))
    assert chart() == [1, 2, 3, 4, 5]
    ingest(client, admin, run_id, loss_points({2: 9.0}))  # a rewrite of a stored step (a resumed attempt)
    r = client.get(f"/api/runs/{run_id}/metrics", params={"name": "loss", "points": 100}, headers=admin)
    assert r.json()["series"][0]["last"][1] == 9.0


def test_a_chart_of_a_run_that_does_not_exist_is_a_404_every_time(client, tokens):
    admin = as_role(client, tokens, "admin")
    for _ in range(2):  # a refusal is not kept as an answer
        r = client.get("/api/runs/999999/metrics", params={"name": "loss"}, headers=admin)
        assert r.status_code == 404, r.text
