"""GET /api/runs/{id}/metrics/axes: the run's steps with the wall-clock seconds since its first step and the tokens
trained up to each (the trainer's per-step `tokens`, summed), at most `points` of them, its first and last among
them: what a chart needs to draw a metric by wall time or by tokens."""
from __future__ import annotations

from tests.api.conftest import as_role
from tests.api.test_run_labels import make_run


def test_wall_time_and_tokens_by_step(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    run_id = make_run(client, admin, tmp_path)
    url = f"/api/runs/{run_id}/metrics"
    assert client.get(f"{url}/axes", headers=admin).json() == {"step": [], "wall_s": [], "tokens": []}
    # steps 1..40, 512 tokens each, 2.5 s apart; sent out of order, in two batches
    points = [{"step": s, "name": "tokens", "value": 512, "wall_time": 1.7e9 + 2.5 * s} for s in range(40, 0, -1)]
    points += [{"step": s, "name": "loss", "value": 5.0 - s / 10, "wall_time": 1.7e9 + 2.5 * s} for s in range(1, 41)]
    for half in (points[:30], points[30:]):
        assert client.post(url, json={"points": half}, headers=admin).status_code == 200
    full = client.get(f"{url}/axes", headers=admin).json()
    assert full["step"] == list(range(1, 41))
    assert full["tokens"] == [512.0 * s for s in range(1, 41)]
    assert full["wall_s"] == [2.5 * (s - 1) for s in range(1, 41)]
    few = client.get(f"{url}/axes", params={"points": 5}, headers=admin).json()
    assert few["step"][0] == 1
    assert few["step"][-1] == 40
    assert len(few["step"]) <= 7, few                      # the budget's buckets and both ends
    assert few["tokens"] == [512.0 * s for s in few["step"]]
    assert client.get(f"{url}/axes", params={"points": 1}, headers=admin).status_code == 422
    assert client.get("/api/runs/999999/metrics/axes", headers=admin).status_code == 404
