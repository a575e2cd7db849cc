"""Shared by every tier."""

from __future__ import annotations

import os

import pytest

from rlrun.dashboard import registry


@pytest.fixture(scope="session", autouse=True)
def dashboard_home(tmp_path_factory):
    """Every `rlrun local` a test starts registers its run with the user's dashboard, and
    starts one in the background when none answers: here in a registry of the session's own
    (never the user's), whose dashboard is stopped when the session ends."""
    home = tmp_path_factory.mktemp("dashboard-home")
    before = os.environ.get(registry.HOME_ENV)
    os.environ[registry.HOME_ENV] = str(home)
    yield home
    try:
        registry.stop()
    finally:
        if before is None:
            os.environ.pop(registry.HOME_ENV, None)
        else:
            os.environ[registry.HOME_ENV] = before
