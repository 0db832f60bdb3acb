"""Kernel Tuner caches of any size import as spaces and replay (tuner/results/kt.py, tuner/space/configs.py), and a
replay-only space says so in one line wherever something would render, compile or run it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.cli.main import main as cli_main
from tuner.errors import InputError
from tuner.study.driver import Driver
from tuner.study.options import StudyOptions

ROOT = Path(__file__).resolve().parent.parent
KT_H200 = ROOT / "tests" / "data" / "kt" / "kt_transpose_h200.json"


@pytest.fixture
def kt_space(tmp_path) -> Path:
    space = tmp_path / "kt.yaml"
    assert cli_main(["import-kt", str(KT_H200), "-o", str(space)]) == 0
    return space


@pytest.mark.parametrize("command", [["check"], ["render"], ["bench", "--json"]])
def test_a_replay_only_space_cannot_be_checked_rendered_or_run(kt_space, capsys, command):
    assert cli_main([command[0], str(kt_space), *command[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert str(kt_space) in err and "has no template" in err and "can only be replayed" in err
    assert "template ''" not in err


def test_a_study_of_a_replay_only_space_needs_a_replay(kt_space):
    opts = StudyOptions(kernel="kt", space=str(kt_space), trials=3, storage=":memory:", in_process=True)
    with pytest.raises(InputError, match="can only be replayed"):
        Driver(opts)
