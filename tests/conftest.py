"""Shared fixtures: every test gets its own compile cache so runs never share state through ~/.cache."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
