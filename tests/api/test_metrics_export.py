"""Every stored point of a run as CSV and Parquet: GET /api/runs/{id}/metrics.csv and .parquet."""
from __future__ import annotations

import csv
import io

from tests.api.conftest import as_role
from tests.api.test_alerts import ingest, running_run


def test_metrics_export_as_csv_and_parquet(client, tokens, tmp_path):
    import pyarrow.parquet as pq

    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path)
    ingest(client, admin, run_id, {"points": [
        {"step": 1, "name": "loss", "value": 6.25, "wall_time": 1.7e9},
        {"step": 1, "name": "lr", "value": 1e-4, "wall_time": 1.7e9},
        {"step": 2, "name": "loss", "value": 5.5, "wall_time": 1.7e9 + 1},
        {"step": 2, "rank": 1, "name": "peak_allocated_gib", "value": 0.5, "wall_time": 1.7e9 + 1}]})
    viewer = as_role(client, tokens, "viewer")
    r = client.get(f"/api/runs/{run_id}/metrics.csv", headers=viewer)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [(int(x["step"]), int(x["rank"]), x["name"], float(x["value"])) for x in rows] == [
        (1, 0, "loss", 6.25), (1, 0, "lr", 1e-4), (2, 0, "loss", 5.5), (2, 1, "peak_allocated_gib", 0.5)]
    r = client.get(f"/api/runs/{run_id}/metrics.parquet", headers=viewer)
    assert r.status_code == 200
    table = pq.read_table(io.BytesIO(r.content))
    assert table.column_names == ["step", "rank", "name", "value", "wall_time"]
    assert table.column("value").to_pylist() == [6.25, 1e-4, 5.5, 0.5]
    assert table.num_rows == 4
    assert client.get("/api/runs/999999/metrics.csv", headers=viewer).status_code == 404
