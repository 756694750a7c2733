"""The rendezvous address a multi-node run's node 0 advertises (worker/gang.py)."""
from __future__ import annotations

import pytest

from backend.core.settings import get_settings
from worker.gang import node_address


@pytest.fixture
def settings_from(monkeypatch):
    def use(**env: str) -> None:
        for k in ("ULAB_NODE_ADDRESS", "ULAB_NODE_INTERFACE", "ULAB_BROKER_URL"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        get_settings.cache_clear()

    yield use
    get_settings.cache_clear()


def test_a_configured_address_wins(settings_from):
    settings_from(ULAB_NODE_ADDRESS="10.1.2.3", ULAB_NODE_INTERFACE="lo")
    assert node_address() == "10.1.2.3"


def test_an_interface_advertises_its_own_address(settings_from):
    settings_from(ULAB_NODE_INTERFACE="lo")
    assert node_address() == "127.0.0.1"
    settings_from(ULAB_NODE_INTERFACE="no-such-if0")
    with pytest.raises(OSError):
        node_address()


def test_otherwise_the_address_that_reaches_the_broker(settings_from):
    settings_from(ULAB_BROKER_URL="redis://127.0.0.1:6379/0")
    assert node_address() == "127.0.0.1"
