"""Kernel Tuner caches of any size import as spaces and replay (tuner/store/kt.py, tuner/space/configs.py), and a
replay-only space says so in one line wherever something would render, compile or run it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.cli.main import main as cli_main
from tuner.core.errors import InputError
from tuner.study.driver import Driver
from tuner.study.options import StudyOptions

ROOT = Path(__file__).resolve().parents[2]
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


# -- caches of any size -------------------------------------------------------------------------------------------


def kt_cache(
    path: Path, tune_params: dict[str, list], valid=lambda c: True, seed: int = 0, objective=("time",)
) -> dict:
    """A Kernel Tuner 1.5 cache over every combination of `tune_params` that `valid` keeps (Kernel Tuner leaves
    restricted configs out), with times from 1 to 50 ms, some compile, runtime and InvalidConfig failures, and a
    list-valued metric beside the time, as Kernel Tuner 1.5 writes it."""
    import itertools
    import json
    import random

    rng = random.Random(seed)
    keys = list(tune_params)
    cache = {}
    for combo in itertools.product(*tune_params.values()):
        config = dict(zip(keys, combo, strict=True))
        if not valid(config):
            continue
        draw = rng.random()
        time_ms: float | str = rng.uniform(1.0, 50.0)
        if draw < 0.05:
            time_ms = "CompilationFailedConfig"
        elif draw < 0.08:
            time_ms = "RuntimeFailedConfig"
        elif draw < 0.12:
            time_ms = "InvalidConfig"
        cache[",".join(str(v) for v in combo)] = {
            **config,
            "time": time_ms,
            "times": [time_ms] * 3 if isinstance(time_ms, float) else [],
            "GFLOP/s": [1.0, 2.0] if isinstance(time_ms, float) else time_ms,
            "compile_time": 1.0,
            "verification_time": 0,
            "benchmark_time": 2.0,
        }
    data = {
        "device_name": "NVIDIA H200",
        "kernel_name": "stencil",
        "problem_size": [4096, 4096],
        "tune_params_keys": keys,
        "tune_params": tune_params,
        "objective": list(objective),
        "cache": cache,
    }
    path.write_text(json.dumps(data))
    return data


BIG = {
    "block_size_x": [16, 32, 64, 128, 256, 512, 1024],
    "block_size_y": [1, 2, 4, 8, 16, 32],
    "tile_x": list(range(1, 11)),
    "tile_y": list(range(1, 11)),
    "unroll": [0, 1, 2, 4],
    "use_shmem": [0, 1],
    "loop": [0, 1, 2],
}


def _big_valid(c) -> bool:
    return c["block_size_x"] * c["block_size_y"] <= 1024 and c["tile_x"] * c["tile_y"] <= 40


def test_a_cache_of_tens_of_thousands_of_configs_imports_and_replays(tmp_path, capsys):
    import json

    import optuna

    from tuner.results import export
    from tuner.space import space as space_mod
    from tuner.study.replay import load_records, params_key

    cache = tmp_path / "stencil.json"
    data = kt_cache(cache, BIG, _big_valid)
    entries = data["cache"].values()
    invalid = [e for e in entries if e["time"] == "InvalidConfig"]
    assert len(data["cache"]) > 40_000 and invalid
    space_file = tmp_path / "stencil.yaml"
    assert cli_main(["import-kt", str(cache), "-o", str(space_file)]) == 0
    out = capsys.readouterr().out
    assert "stencil.configs.json" in out and str(space_file) in out
    assert (tmp_path / "stencil.configs.json").is_file() and space_file.stat().st_size < 4096
    space = space_mod.load(space_file)
    keys = data["tune_params_keys"]
    valid = {params_key({k: e[k] for k in keys}) for e in entries if e["time"] != "InvalidConfig"}
    assert {params_key(c) for c in space.enumerate()} == valid
    assert space.count_valid_bounded() == (len(valid), True)
    assert len(space.valid_positions()) == len(valid)
    bad = {k: invalid[0][k] for k in keys}
    assert "not one of the" in (space.validate(bad) or "")
    # a study replays it: failures are trials, and `tuner best` agrees with the shortest time measured
    url = f"sqlite:///{tmp_path / 'stencil.db'}"
    opts = StudyOptions(
        kernel="kt", space=str(space_file), trials=60, storage=url, seed=0, replay=str(cache), in_process=True
    )
    summary = Driver(opts).run()
    assert summary["trials"] == 60
    study = optuna.load_study(study_name=summary["study"], storage=url)
    records = load_records(str(cache))
    for t in study.trials:
        assert params_key(t.params) in valid
        assert t.state.name == records[params_key(t.params)][0]
    measured = [t.user_attrs["median_ms"] for t in export.measured_trials(export.open_study(url))]
    assert cli_main(["best", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["value"] == min(measured)


def test_a_cache_of_a_hundred_thousand_valid_configs_fits_a_space(tmp_path):
    from tuner.space import space as space_mod

    params = {"a": list(range(50)), "b": list(range(50)), "c": list(range(48))}
    cache = tmp_path / "huge.json"
    data = kt_cache(cache, params, lambda c: (c["a"] + c["b"] + c["c"]) % 7 != 0)
    valid = sum(1 for e in data["cache"].values() if e["time"] != "InvalidConfig")
    assert valid > 90_000
    space_file = tmp_path / "huge.yaml"
    assert cli_main(["import-kt", str(cache), "-o", str(space_file)]) == 0
    assert space_mod.load(space_file).count_valid_bounded() == (valid, True)


def test_a_cache_of_every_combination_needs_no_list(tmp_path):
    from tuner.space import space as space_mod

    cache = tmp_path / "full.json"
    data = kt_cache(cache, {"x": [1, 2, 4], "y": [8, 16]}, objective=("time",))
    for entry in data["cache"].values():
        entry["time"] = 1.5
    cache.write_text(__import__("json").dumps(data))
    space_file = tmp_path / "full.yaml"
    assert cli_main(["import-kt", str(cache), "-o", str(space_file)]) == 0
    assert "\nconfigs:" not in space_file.read_text()
    assert space_mod.load(space_file).count_valid() == 6


def test_faults_in_a_cache_name_the_cache(tmp_path, capsys):
    import json

    cache = tmp_path / "odd.json"
    data = kt_cache(cache, {"x": [1, 2], "y": [3, 4]})
    next(iter(data["cache"].values()))["x"] = 7  # a value its tune_params do not have
    cache.write_text(json.dumps(data))
    assert cli_main(["import-kt", str(cache), "-o", str(tmp_path / "odd.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert str(cache) in err and "x=7" in err and len(err.splitlines()) == 1 and "tmp" not in err.split(str(cache))[1]
    assert not (tmp_path / "odd.yaml").exists()


@pytest.mark.parametrize("name", ["größe", "2x"])
def test_a_param_that_is_no_c_identifier_is_one_line_naming_the_cache(tmp_path, capsys, name):
    """A Kernel Tuner param reaches CUDA as a #define: a Python identifier that is no C one (größe) is refused at
    import, not at every config's compile."""
    cache = tmp_path / "odd.json"
    kt_cache(cache, {name: [1, 2], "y": [3, 4]})
    assert cli_main(["import-kt", str(cache), "-o", str(tmp_path / "odd.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(cache) in err and f"{name!r} is not a C identifier" in err, err
    assert not (tmp_path / "odd.yaml").exists()


def test_a_bad_configs_list_is_one_line_naming_its_file(tmp_path, capsys):
    import json

    space = tmp_path / "s.yaml"
    base = "kernel: kt\nproblem: {name: p, dtype: float32}\nparams: {x: [1, 2], y: [3, 4]}\n"
    cases = {
        "configs: [[1, 3], [2, 5]]\n": (str(space), "configs[1]: y=5 is not one of [3, 4]"),
        "configs: [[1, 3], [2]]\n": (str(space), "configs[1]: expected a list of 2 values"),
        "configs: []\n": (str(space), "lists no config"),
        "configs: missing.json\n": (str(space), "configs file missing.json not found"),
        "configs: c.json\n": (str(tmp_path / "c.json"), "configs[0]: x=9 is not one of [1, 2]"),
    }
    (tmp_path / "c.json").write_text(json.dumps({"params": ["x", "y"], "configs": [[9, 3]]}))
    for tail, (where, fault) in cases.items():
        space.write_text(base + tail)
        assert cli_main(["check", str(space)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and where in err and fault in err, (tail, err)
    (tmp_path / "c.json").write_text("[1, 2")
    space.write_text(base + "configs: c.json\n")
    assert cli_main(["check", str(space)]) == 2
    assert "not a configs file" in capsys.readouterr().err


def test_listed_configs_count_toward_the_space_hash(tmp_path):
    import json

    from tuner.space import space as space_mod

    space = tmp_path / "s.yaml"
    space.write_text(
        "kernel: kt\nproblem: {name: p, dtype: float32}\nparams: {x: [1, 2], y: [3, 4]}\nconfigs: c.json\n"
    )
    (tmp_path / "c.json").write_text(json.dumps({"configs": [[1, 3], [2, 4]]}))
    first = space_mod.load(space).content_hash()
    (tmp_path / "c.json").write_text(json.dumps({"configs": [[1, 3], [2, 3]]}))
    assert space_mod.load(space).content_hash() != first


# -- Kernel Tuner's restrictions ------------------------------------------------------------------------------------


def test_restrictions_that_describe_the_valid_set_become_its_constraints(tmp_path, capsys):
    """Restrictions that parse as our expressions and single out the cache's valid configs are the space's
    constraints, and no list is written; a long list of them is no problem."""
    import json

    from tuner.space import space as space_mod

    params = {"bx": [32, 64, 128, 256, 512], "by": [1, 2, 4, 8], "tile": [1, 2, 3, 4, 5, 6, 7, 8]}
    cache = tmp_path / "r.json"
    data = kt_cache(cache, params, lambda c: c["bx"] * c["by"] <= 1024 and c["tile"] * c["by"] <= 16)
    for entry in data["cache"].values():
        if entry["time"] == "InvalidConfig":
            entry["time"] = "CompilationFailedConfig"  # a failure, not outside the valid set
    cache.write_text(json.dumps(data))
    restrictions = ["bx * by <= 1024", "tile * by <= 16"] + [f"tile != {n}" for n in range(100, 400)]
    rfile = tmp_path / "restrictions.json"
    rfile.write_text(json.dumps(restrictions))
    space_file = tmp_path / "r.yaml"
    assert cli_main(["import-kt", str(cache), "-o", str(space_file), "--restrictions", str(rfile)]) == 0
    capsys.readouterr()
    text = space_file.read_text()
    assert "\nconfigs:" not in text and "bx * by <= 1024" in text
    space = space_mod.load(space_file)
    assert len(space.constraints) == len(restrictions)
    assert space.count_valid() == len(data["cache"])


def test_restrictions_that_do_not_parse_or_do_not_hold_are_left_out_and_the_configs_listed(tmp_path, capsys):
    from tuner.space import space as space_mod
    from tuner.study.replay import params_key

    cache = tmp_path / "stencil.json"
    data = kt_cache(cache, BIG, _big_valid)
    space_file = tmp_path / "stencil.yaml"
    argv = ["import-kt", str(cache), "-o", str(space_file)]
    argv += ["--restriction", "block_size_x * block_size_y <= 1024", "--restriction", "tile_x * tile_y <= 40"]
    argv += ["--restriction", "lambda p: p['tile_x'] > 0", "--restriction", "unroll < 4"]
    argv += ["--restriction", "problem_size[0] > 0"]
    assert cli_main(argv) == 0
    captured = capsys.readouterr()
    notes = captured.err.strip().splitlines()
    assert len(notes) == 3 and all(line.startswith(f"{cache}: restriction ") for line in notes)
    assert "'unroll < 4' left out:" in captured.err and "break it" in captured.err
    assert "problem_size" in captured.err and "lambda" in captured.err
    space = space_mod.load(space_file)
    assert [c.text for c in space.constraints] == ["block_size_x * block_size_y <= 1024", "tile_x * tile_y <= 40"]
    keys = data["tune_params_keys"]
    valid = {params_key({k: e[k] for k in keys}) for e in data["cache"].values() if e["time"] != "InvalidConfig"}
    assert {params_key(c) for c in space.enumerate()} == valid  # InvalidConfig configs: the list leaves them out


def test_a_bad_restrictions_file_is_one_line(tmp_path, capsys):
    cache = tmp_path / "c.json"
    kt_cache(cache, {"x": [1, 2], "y": [3, 4]})
    rfile = tmp_path / "r.json"
    rfile.write_text('["x > 0", 3]')
    assert cli_main(["import-kt", str(cache), "-o", str(tmp_path / "s.yaml"), "--restrictions", str(rfile)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(rfile) in err and "list of expression strings" in err and len(err.splitlines()) == 1


def test_a_listed_space_replayed_over_its_recorded_configs_only(tmp_path):
    """benchmarks/search.py replays a cache over the recorded configs alone (`replay_recorded_only`): a listed
    space is cut to them, never walked as a Cartesian product."""
    from tuner.study.replay import load_records

    cache = tmp_path / "stencil.json"
    kt_cache(cache, BIG, _big_valid)
    space_file = tmp_path / "stencil.yaml"
    assert cli_main(["import-kt", str(cache), "-o", str(space_file)]) == 0
    opts = StudyOptions(
        kernel="kt",
        space=str(space_file),
        trials=30,
        storage=":memory:",
        seed=0,
        replay=str(cache),
        in_process=True,
        replay_recorded_only=True,
        progress=False,
    )
    driver = Driver(opts)
    records = load_records(str(cache))
    assert driver.space.count_valid_bounded() == (
        sum(1 for s, a in records.values() if a.get("failure") != "invalid"),
        True,
    )
    summary = driver.run()
    assert summary["trials"] == 30


@pytest.mark.parametrize(
    ("change", "fault"),
    [
        ({"tune_params": {"x": 3, "y": [3, 4]}}, "tune_params is not a mapping"),
        ({"tune_params_keys": "x,y"}, "tune_params_keys is not a list"),
        ({"cache": []}, "'cache' is not a mapping"),
        ({"tune_params": {"x": [1, 2], "y": ["a b", 3, 4]}}, None),
    ],
)
def test_a_malformed_cache_header_is_one_line_naming_the_cache(tmp_path, capsys, change, fault):
    import json

    cache = tmp_path / "c.json"
    data = kt_cache(cache, {"x": [1, 2], "y": [3, 4]})
    if fault is None:  # a string value that is no identifier, used by a valid config
        entry = next(iter(data["cache"].values()))
        entry["y"], entry["time"] = "a b", 1.0
        fault = "value 'a b' cannot be a space's value"
    data.update(change)
    cache.write_text(json.dumps(data))
    assert cli_main(["import-kt", str(cache), "-o", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(cache) in err and fault in err, err
