"""Database files (`tuner.store.dbfiles`): the one --storage normalisation and its one default."""

from __future__ import annotations

import pytest

from tuner.core.errors import InputError
from tuner.store import dbfiles


def test_one_default_and_one_normalisation_of_storage():
    assert dbfiles.study_storage_url(None, "gemm") == f"sqlite:///{dbfiles.STUDIES_DIR}/gemm.db"
    assert dbfiles.study_storage_url("runs/x.db", "gemm") == "sqlite:///runs/x.db"
    assert dbfiles.study_storage_url("postgresql://h/db", "gemm") == "postgresql://h/db"
    with pytest.raises(InputError, match="not a database file's name"):
        dbfiles.study_storage_url("runs/x.txt", "gemm")
