"""Fixtures of the insight tests."""

from __future__ import annotations

import sqlite3

import pytest

from tests.insight.captures import DATA


@pytest.fixture
def study_db(tmp_path):
    """A copy of the recorded H200 transpose study (tests/data/transpose_h200.db) to explain."""
    db = tmp_path / "t.db"
    src = sqlite3.connect(f"file:{DATA.parent / 'transpose_h200.db'}?mode=ro", uri=True)
    src.backup(sqlite3.connect(db))
    return db
