"""The Python API (`import tuner`): the same study as the CLI, and a result object instead of printed tables.
Real Ray (one logical GPU), real Optuna and SQLite, answers replayed from the recorded H200 transpose study."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd

import tuner

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"


def _trials(url: str) -> list[tuple]:
    (summary,) = optuna.get_all_study_summaries(url)
    study = optuna.load_study(study_name=summary.study_name, storage=url)
    return summary.study_name, [(t.number, t.state.name, t.params, t.values) for t in study.trials]


def test_api_study_is_the_cli_study(tmp_path):
    args = dict(trials=12, sampler="tpe", seed=7, gpus=1, replay=str(RECORDING))
    cli_url, api_url = f"sqlite:///{tmp_path}/cli.db", f"sqlite:///{tmp_path}/api.db"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner",
            "study",
            "transpose",
            "--space",
            "transpose",
            "--trials",
            "12",
            "--sampler",
            "tpe",
            "--seed",
            "7",
            "--gpus",
            "1",
            "--replay",
            str(RECORDING),
            "--storage",
            cli_url,
            "--json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = tuner.study("transpose", storage=api_url, **args)
    assert _trials(cli_url) == _trials(api_url)
    import ray

    assert not ray.is_initialized()  # the Ray the call started is gone: later calls may join another cluster

    assert isinstance(result, tuner.StudyResult) and result.summary["trials"] == 12
    best = result.best
    measured = [t for t in result.study.trials if t.state.name == "COMPLETE"]
    assert best["tbps"] == max(t.user_attrs["tbps"] for t in measured)
    assert isinstance(result.pareto, pd.DataFrame) and len(result.pareto) >= 1
    assert isinstance(result.trials, pd.DataFrame) and len(result.trials) == len(result.study.trials) >= 12
    header = result.export_header(tmp_path / "t.h")
    assert best["uri"] in header.read_text()


def test_load_space_takes_a_path_or_a_shipped_name():
    assert tuner.load_space("transpose").kernel == "transpose"
    assert tuner.load_space(ROOT / "examples" / "scale_add" / "scale_add.yaml").family.name == "scale_add"


def test_study_and_bench_are_plain_functions_of_the_api():
    """`tuner.study` and `tuner.bench` are `tuner.api`'s functions, and stay so once the study stage and the GPU
    evaluator are imported (the stage package `tuner.study` is reached by importing from it)."""
    from tuner.gpu.evaluator import GpuEvaluator  # noqa: F401
    from tuner.study.driver import run_study  # noqa: F401

    assert tuner.study is tuner.api.study and tuner.bench is tuner.api.bench
    assert tuner.tune is tuner.api.tune and tuner.load_space is tuner.api.load_space


def test_study_takes_every_option_of_the_cli():
    """`tuner study` is `tuner.study` with the same arguments: each of its flags is a keyword of the call (under
    its own name; --categorical is ordered=False, --json is progress=False)."""
    import inspect

    from tuner.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["study"]
    flags = {a.dest for a in sub._actions if a.dest != "help"} - {"space", "kernel", "trials", "json", "categorical"}
    from tuner import api

    keywords = set(inspect.signature(api.study).parameters)
    assert flags <= keywords, flags - keywords
    assert {"ordered", "progress", "kernel"} <= keywords


def test_bad_repair_is_bad_input():
    import pytest

    with pytest.raises(tuner.InputError, match="repair 'closest'"):
        tuner.study("transpose", 1, repair="closest", replay=str(RECORDING))


def test_a_loaded_space_is_studied_as_it_is_not_read_again(tmp_path):
    """A SearchSpace given to `tuner.study` goes to the driver as it is: its file, gone since it was loaded, is not
    read again (a user's family module would run again if it were)."""
    copied = tmp_path / "transpose_copy.yaml"
    copied.write_text((ROOT / "search_spaces" / "transpose.yaml").read_text())
    space = tuner.load_space(copied)
    copied.unlink()
    url = f"sqlite:///{tmp_path}/loaded.db"
    result = tuner.study(space, 4, replay=str(RECORDING), in_process=True, storage=url, seed=1)
    assert result.summary["trials"] == 4
    assert result.study.user_attrs["space_path"] == str(copied)
