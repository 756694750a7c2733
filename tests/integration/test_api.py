"""The HTTP API against the real server on PostgreSQL: validation, run lifecycle, metric ingest and query."""
import json
import threading
import time

import httpx
import pytest

from backend.metrics.chart import plan_buckets
from tests.tiny import tiny_plan

QWEN = {
    "model": {"preset": "Qwen/Qwen3-4B"},
    "hardware": {"gpu": "H100-80GB", "gpus_per_node": 4, "num_nodes": 1},
    "parallel": {"sp_size": 4, "dp_size": 1},
    "training": {"seq_len": 32768, "grad_accum": 8, "zero_stage": 3, "offload_optimizer": True},
}


def variant(section: str, **changes) -> dict:
    plan = json.loads(json.dumps(QWEN))
    plan[section].update(changes)
    return plan


def fields(response: httpx.Response) -> list[str]:
    return [d["field"] for d in response.json()["detail"]]


@pytest.mark.parametrize("plan, field", [
    (variant("training", seq_len=32771), "training.seq_len"),
    (variant("parallel", sp_size=3) | {"hardware": {"gpu": "H100-80GB", "gpus_per_node": 3}}, "parallel.sp_size"),
    (variant("hardware", gpus_per_node=8), ("hardware", "parallel")),
    ({**QWEN, "model": {"preset": "no/such-model"}}, "model"),
    (variant("hardware", gpu="Z9000"), "hardware.gpu"),
    (variant("training", seq_len="long"), "training.seq_len"),
    (variant("parallel", sp_size=0), "parallel.sp_size"),
])
def test_bad_plans_are_422_naming_the_field(api, plan, field):
    r = api.post("/api/plans", json=plan)
    assert r.status_code == 422, r.text
    prefixes = field if isinstance(field, tuple) else (field,)
    assert any(f.startswith(prefixes) for f in fields(r)), r.text


def test_plan_is_stored_with_the_same_estimate_as_the_cli(api, tmp_path):
    import subprocess

    from tests.services import ULAB

    r = api.post("/api/plans", json={"name": "qwen 32k", **QWEN})
    assert r.status_code == 201, r.text
    stored = api.get(f"/api/plans/{r.json()['id']}").json()
    assert stored["name"] == "qwen 32k"
    assert stored["estimate"]["valid"] is True
    (tmp_path / "p.json").write_text(json.dumps(stored["plan"]))
    cli = subprocess.run([str(ULAB), "plan", "--json", str(tmp_path / "p.json")], capture_output=True, text=True)
    assert json.loads(cli.stdout) == stored["estimate"]
    live = api.post("/api/estimate", json=QWEN).json()
    assert live == stored["estimate"]


def test_invalid_plan_estimate_answers_errors_for_live_forms(api):
    r = api.post("/api/estimate", json=variant("training", seq_len=32771))
    assert r.status_code == 200
    assert r.json()["valid"] is False
    assert r.json()["errors"][0]["field"] == "training.seq_len"


def test_run_lifecycle_without_training(api, tmp_path):
    plan_id = api.post("/api/plans", json=tiny_plan()).json()["id"]
    body = {"plan_id": plan_id, "name": "never runs", "run": {"steps": 5, "data": {"path": str(tmp_path / "x.txt")}}}
    run = api.post("/api/runs", json=body).json()
    assert run["state"] == "pending_approval"
    assert run["steps"] == 5
    assert run["spec"]["run"]["steps"] == 5
    assert run["estimate"]["valid"] is True
    r = api.post(f"/api/runs/{run['id']}/cancel")
    assert r.status_code == 200
    assert r.json()["state"] == "cancelled"
    r = api.post(f"/api/runs/{run['id']}/approve")
    assert r.status_code == 409
    assert fields(r) == ["state"]
    assert api.post(f"/api/runs/{run['id']}/cancel").status_code == 409
    assert api.get("/api/runs/999999").status_code == 404
    assert api.post("/api/runs", json={**body, "plan_id": 999999}).status_code == 404
    listed = api.get("/api/runs", params={"state": "cancelled"}).json()
    assert run["id"] in [x["id"] for x in listed]
    assert all(x["state"] == "cancelled" for x in listed)


def _run_for_metrics(api, tmp_path) -> int:
    plan_id = api.post("/api/plans", json=tiny_plan()).json()["id"]
    return api.post("/api/runs", json={"plan_id": plan_id, "name": "metrics",
                                                      "run": {"data": {"path": str(tmp_path)}}}).json()["id"]


def expected_buckets(points: dict[int, float], start: int, stop: int, width: int) -> list[tuple]:
    """(last step, min, max, last) per W-aligned bucket, computed from the raw points in Python."""
    out: dict[int, list] = {}
    for step in sorted(s for s in points if start <= s <= stop):
        b = out.setdefault(step // width, [step, points[step], points[step], points[step]])
        b[0], b[1], b[2], b[3] = step, min(b[1], points[step]), max(b[2], points[step]), points[step]
    return [tuple(v) for _, v in sorted(out.items())]


def test_metric_ingest_is_idempotent_and_query_buckets(api, tmp_path):
    run_id = _run_for_metrics(api, tmp_path)
    url = f"/api/runs/{run_id}/metrics"
    loss = {s: 10.0 - s / 100 + (0.5 if s % 37 == 0 else 0.0) for s in range(1, 5001)}
    points = [{"rank": 0, "step": s, "name": "loss", "value": v, "wall_time": 1.0} for s, v in loss.items()]
    points += [{"rank": r, "step": s, "name": "peak_allocated_gib", "value": r + s / 1000, "wall_time": 1.0}
               for r in (0, 1) for s in range(1, 1001)]
    assert api.post(url, json={"points": points[:2500]}).json() == {"accepted": 2500}
    assert api.post(url, json={"points": points[2000:]}).json() == {"accepted": len(points) - 2000}  # overlap
    full = api.get(url, params={"name": "loss", "points": 10_000}).json()["series"][0]
    assert full["step"] == list(range(1, 5001))
    assert full["last"] == [loss[s] for s in range(1, 5001)]
    # budgets from raw rows only to rollup blocks with raw edges; zoomed ranges off the block grid
    for start, stop, budget in [(None, None, 100), (None, None, 7), (101, 200, 10), (333, 4444, 50), (17, 4000, 3)]:
        params = {"name": "loss", "points": budget} | ({"start": start, "end": stop} if start else {})
        s = api.get(url, params=params).json()["series"][0]
        lo, hi = start or 1, stop or 5000
        assert 0 < len(s["step"]) <= budget
        width, _ = plan_buckets(lo, hi, budget)  # SQL over rollups + raw edges == Python over raw points
        assert list(zip(s["step"], s["min"], s["max"], s["last"])) == expected_buckets(loss, lo, hi, width), params
    mem = api.get(url, params={"name": "peak_allocated_gib", "points": 10}).json()["series"]
    assert [m["rank"] for m in mem] == [0, 1]
    assert mem[1]["last"][-1] == pytest.approx(2.0)
    assert api.get(f"{url}/names").json() == ["loss", "peak_allocated_gib"]
    # a NaN loss or grad norm raises an alert (tests/api/test_alerts.py); any other NaN is refused
    bad = api.post(url, json={"points": [{"rank": 0, "step": 1, "name": "peak_allocated_gib", "value": "nan"}]})
    assert bad.status_code == 422
    assert fields(bad) == ["points[0].value"]


def test_text_the_database_cannot_store_is_a_422_not_a_500(api, tmp_path):
    run_id = _run_for_metrics(api, tmp_path)
    bad = api.post(f"/api/runs/{run_id}/metrics",
                   json={"points": [{"rank": 0, "step": 1, "name": "lo\u0000ss", "value": 1.0}]})
    assert bad.status_code == 422
    assert fields(bad) == ["points[0].name"]
    plan_id = api.post("/api/plans", json=tiny_plan()).json()["id"]
    bad = api.post("/api/runs", json={"plan_id": plan_id, "name": "two\nlines",
                                      "run": {"data": {"path": str(tmp_path)}}})
    assert bad.status_code == 422
    assert fields(bad) == ["name"]
    # a NUL in a query parameter reaches PostgreSQL, which refuses it: answered 422, not 500
    bad = api.get(f"/api/runs/{run_id}/metrics", params={"name": "lo\x00ss"})
    assert bad.status_code == 422, bad.text
    assert fields(bad) == ["request"], bad.text
    assert api.get("/api/health").status_code == 200


def test_stream_sends_state_then_new_points(api, tmp_path):
    run_id = _run_for_metrics(api, tmp_path)
    events: list[tuple[str, dict]] = []

    def listen():
        with api.stream("GET", f"/api/runs/{run_id}/stream", timeout=10) as r:
            event = None
            for line in r.iter_lines():
                if line.startswith("event:"):
                    event = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and event:
                    events.append((event, json.loads(line.split(":", 1)[1])))
                    if event == "metrics":
                        return

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    end = time.monotonic() + 10
    while not events and time.monotonic() < end:
        time.sleep(0.05)
    api.post(f"/api/runs/{run_id}/metrics",
               json={"points": [{"rank": 0, "step": 7, "name": "loss", "value": 1.5}]})
    t.join(10)
    assert events[0][0] == "state"
    assert events[0][1]["id"] == run_id
    assert events[-1] == ("metrics", {"points": [{"rank": 0, "step": 7, "name": "loss", "value": 1.5}]})
