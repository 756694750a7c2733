"""The share link's `url` (POST /api/runs/{id}/share): at ULAB_PUBLIC_URL when it is set (a proxy in front of the API
that does not pass the host on would give the request's own, internal, base URL), else at the request's."""
from __future__ import annotations

import pytest

from backend.core import settings
from tests.api.conftest import as_role
from tests.api.test_token_scope import queued_run


@pytest.fixture
def public_url(monkeypatch):
    monkeypatch.setenv("ULAB_PUBLIC_URL", "https://lab.example.org/ulab/")
    settings.get_settings.cache_clear()
    yield "https://lab.example.org/ulab"
    monkeypatch.delenv("ULAB_PUBLIC_URL")
    settings.get_settings.cache_clear()


def share_url(client, tokens, run_id: int) -> tuple[str, str]:
    r = client.post(f"/api/runs/{run_id}/share", json={"days": 1}, headers=as_role(client, tokens, "admin"))
    assert r.status_code == 201, r.text
    return r.json()["url"], r.json()["token"]


def test_the_link_is_at_the_requests_base_url_by_default(client, tokens, tmp_path):
    run_id = queued_run(client, tokens, tmp_path)
    url, token = share_url(client, tokens, run_id)
    assert url == f"http://testserver/#/runs/{run_id}?share={token}"


def test_the_link_is_at_the_public_url_when_set(client, tokens, tmp_path, public_url):
    run_id = queued_run(client, tokens, tmp_path)
    url, token = share_url(client, tokens, run_id)
    assert url == f"{public_url}/#/runs/{run_id}?share={token}"
