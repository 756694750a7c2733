"""Fixtures of the integration tests."""
from __future__ import annotations

import os

import pytest

from tests.integration.trainer_runs import Runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist: the session's directory
    return Runs(shared / "trainer_runs")
