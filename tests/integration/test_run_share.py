"""A run's view-only share link against the real stack (the API process on PostgreSQL): who may make and revoke one,
what its token reads (that run's page: the run, timeline, metrics, the live stream) and what it does not (another
run, the lists, plans, the log, checkpoints, every action), and that only the token's SHA-256 is stored."""
from __future__ import annotations

import hashlib
import time

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.tiny import submit, tiny_plan


def _rows(pg_url: str, sql: str, **params) -> list:
    engine = create_engine(pg_url)
    try:
        with engine.begin() as conn:
            result = conn.execute(text(sql), params)
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def two_runs(stack, api, corpus) -> tuple[int, int]:
    """Two runs waiting for approval, each with a few loss points (posted through the real ingest path)."""
    ids = []
    for name in ("shared", "not-shared"):
        run = submit(api, tiny_plan(sp_size=1), {"steps": 5, "data": {"path": str(corpus)}}, name=f"share-{name}",
                     approve=False)
        r = api.post(f"/api/runs/{run['id']}/metrics",
                     json={"points": [{"rank": 0, "step": s, "name": "loss", "value": 6.0 - s} for s in (1, 2, 3)]})
        assert r.status_code == 200, r.text
        ids.append(run["id"])
    return ids[0], ids[1]


def _reader(stack, token: str | None = None, timeout_s: float = 30) -> httpx.Client:
    """A client with no API token and no cookie: only the share token, if given, as a bearer header."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=stack.url, headers=headers, timeout=timeout_s)


def test_a_share_link_reads_its_run_only_and_acts_on_nothing(stack, api, pg_url, two_runs):
    rid, other = two_runs
    made = api.post(f"/api/runs/{rid}/share", json={"days": 7})
    assert made.status_code == 201, made.text
    share = made.json()
    token = share["token"]
    assert token.startswith("ulab_share_")
    assert share["url"] == f"{stack.url}/#/runs/{rid}?share={token}"
    assert share["expires_at"]
    # only the SHA-256 is stored: no column of the row holds the token
    stored = _rows(pg_url, "SELECT * FROM run_shares WHERE id = :id", id=share["id"])
    assert len(stored) == 1
    assert stored[0].token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in [str(v) for v in stored[0]]
    assert token.startswith(stored[0].prefix)

    with _reader(stack, token) as reader, _reader(stack) as nobody:
        for path in (f"/api/runs/{rid}", f"/api/runs/{rid}/events", f"/api/runs/{rid}/metrics/names",
                     f"/api/runs/{rid}/metrics/axes", f"/api/runs/{rid}/metrics.csv",
                     f"/api/runs/{rid}/metrics.parquet"):
            assert nobody.get(path).status_code == 401, path  # the link's token is what opens it
            assert reader.get(path).status_code == 200, path
        assert reader.get(f"/api/runs/{rid}").json()["name"] == "share-shared"
        loss = reader.get(f"/api/runs/{rid}/metrics", params={"name": "loss"}).json()
        assert loss["series"][0]["step"] == [1, 2, 3]
        assert nobody.get(f"/api/runs/{rid}/metrics", params={"name": "loss"}).status_code == 401
        # where no header can go (EventSource, a download link): the same token as ?share=
        assert nobody.get(f"/api/runs/{rid}/metrics.csv", params={"share": token}).text.startswith("step,rank,name")
        with nobody.stream("GET", f"/api/runs/{rid}/stream", params={"share": token}) as events:
            assert events.status_code == 200
            first = next(line for line in events.iter_lines() if line.startswith("data:"))
            assert f'"id": {rid}' in first or f'"id":{rid}' in first, first

        # another run: 403, by header or by query
        for path in (f"/api/runs/{other}", f"/api/runs/{other}/events", f"/api/runs/{other}/metrics/names"):
            r = reader.get(path)
            assert r.status_code == 403, (path, r.text)
            assert f"opens run {rid} only" in r.json()["detail"][0]["message"]
            assert nobody.get(path, params={"share": token}).status_code == 403, path
        # no list, no plan, no log or checkpoint, no planner: the token is no API token
        for path in ("/api/runs", "/api/plans", f"/api/plans/{reader.get(f'/api/runs/{rid}').json()['plan_id']}",
                     f"/api/runs/{rid}/log", f"/api/runs/{rid}/log/download", f"/api/runs/{rid}/checkpoints",
                     f"/api/runs/{rid}/fix", f"/api/runs/{rid}/share", "/api/session", "/api/workers",
                     "/api/calibration", "/api/tokens"):
            assert reader.get(path).status_code == 401, path
        assert nobody.get("/api/runs", params={"share": token}).status_code == 401
        # and it acts on nothing
        for method, path in (("POST", f"/api/runs/{rid}/approve"), ("POST", f"/api/runs/{rid}/cancel"),
                             ("POST", f"/api/runs/{rid}/retry"), ("PATCH", f"/api/runs/{rid}"),
                             ("POST", f"/api/runs/{rid}/share"), ("DELETE", f"/api/runs/{rid}/share")):
            r = reader.request(method, path, json={})
            assert r.status_code in (401, 403), (method, path, r.status_code)
            r = nobody.request(method, path, params={"share": token}, json={})
            assert r.status_code in (401, 403), (method, path, r.status_code)
        r = reader.post(f"/api/runs/{rid}/metrics", json={"points": [{"rank": 0, "step": 9, "name": "loss",
                                                                      "value": 1.0}]})
        assert r.status_code in (401, 403), r.text
    assert api.get(f"/api/runs/{rid}").json()["state"] == "pending_approval"
    assert api.get(f"/api/runs/{rid}/metrics/names").json() == ["loss"]
    assert api.get(f"/api/runs/{rid}").json()["last_step"] <= 3
    # the ?share= requests above are in the API's access log without their token
    log = stack.api.log.read_text(errors="replace")
    assert f"/api/runs/{rid}/stream?share=[redacted]" in log, log[-3000:]
    assert token not in log


def test_only_the_owner_an_approver_or_an_admin_shares_and_a_revoked_or_expired_link_opens_nothing(
        stack, api, pg_url, corpus):
    with stack.client("submitter") as owner, stack.client("submitter") as stranger, \
            stack.client("approver") as approver, stack.client("viewer") as viewer:
        plan_id = owner.post("/api/plans", json=tiny_plan(sp_size=1)).json()["id"]
        r = owner.post("/api/runs", json={"plan_id": plan_id, "name": "share-owned",
                                          "run": {"steps": 3, "data": {"path": str(corpus)}}})
        assert r.status_code == 201, r.text
        rid = r.json()["id"]
        assert viewer.post(f"/api/runs/{rid}/share").status_code == 403
        assert stranger.post(f"/api/runs/{rid}/share").status_code == 403  # another submitter's run
        assert stranger.delete(f"/api/runs/{rid}/share").status_code == 403
        assert owner.post(f"/api/runs/{rid}/share", json={"days": 0}).status_code == 422
        assert owner.post("/api/runs/999999/share").status_code == 404
        mine = owner.post(f"/api/runs/{rid}/share").json()  # no body: the default 30 days
        theirs = approver.post(f"/api/runs/{rid}/share", json={"days": 1}).json()
        admins = api.post(f"/api/runs/{rid}/share").json()
        listed = owner.get(f"/api/runs/{rid}/share").json()
        assert [s["id"] for s in listed] == [mine["id"], theirs["id"], admins["id"]]
        assert all("token" not in s for s in listed)

        with _reader(stack, mine["token"]) as a, _reader(stack, theirs["token"]) as b, \
                _reader(stack, admins["token"]) as c, _reader(stack, timeout_s=10) as page, \
                page.stream("GET", f"/api/runs/{rid}/stream", params={"share": mine["token"]}) as events:
            assert [x.get(f"/api/runs/{rid}").status_code for x in (a, b, c)] == [200, 200, 200]
            # a live stream opened with a link ends when the link is revoked (below)
            lines = events.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            # expired: the link no longer opens the run, nor is it listed
            _rows(pg_url, "UPDATE run_shares SET expires_at = now() - interval '1 second' WHERE id = :id",
                  id=theirs["id"])
            r = b.get(f"/api/runs/{rid}")
            assert r.status_code == 401, r.text
            assert "revoked or expired" in r.json()["detail"][0]["message"]
            assert [s["id"] for s in owner.get(f"/api/runs/{rid}/share").json()] == [mine["id"], admins["id"]]
            # revoked: every live link of the run at once
            assert owner.delete(f"/api/runs/{rid}/share").json() == {"revoked": 2}
            assert [x.get(f"/api/runs/{rid}").status_code for x in (a, b, c)] == [401, 401, 401]
            started = time.monotonic()
            # the server closes the stream: the iteration ends (an open one would wait for its next ping, 15 s, and
            # time out after 10)
            rest = list(lines)
            assert time.monotonic() - started < 10, rest
            assert not any(line.startswith("data:") for line in rest), rest
            assert a.get(f"/api/runs/{rid}/metrics/names").status_code == 401
            assert owner.get(f"/api/runs/{rid}/share").json() == []
            assert owner.delete(f"/api/runs/{rid}/share").json() == {"revoked": 0}
        owner.post(f"/api/runs/{rid}/cancel")
