"""The command line, run as a user runs it (a subprocess): outputs, exit codes, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tuner(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def assert_bad_input(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("tuner: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert proc.stdout == ""


def test_spaces_json_lists_every_shipped_space():
    proc = tuner("spaces", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    by_name = {r["name"]: r for r in rows}
    assert {"gemm", "transpose", "copy"} <= set(by_name)
    for r in rows:
        assert {"name", "kernel", "cartesian", "valid"} <= set(r)
        assert 0 < r["valid"] <= r["cartesian"]
    assert by_name["gemm"]["valid"] >= 10_000


def test_render_prints_source_with_overrides():
    proc = tuner("render", "transpose", "--set", "pad=1")
    assert proc.returncode == 0, proc.stderr
    assert "__global__" in proc.stdout and "pad1" in proc.stdout


def test_check_json_sample(tmp_path):
    proc = tuner(
        "check",
        "search_spaces/copy.yaml",
        "--sample",
        "5",
        "--seed",
        "2",
        "--json",
        env={"TUNER_CACHE_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["compiled"] == 5 and report["failed"] == 0
    assert all(
        c["registers"] > 0 and "params" in c and "smem_bytes" in c and "spill_bytes" in c for c in report["configs"]
    )


def test_check_exits_1_when_a_valid_config_fails_to_compile(tmp_path):
    templates = tmp_path / "templates"
    templates.mkdir()
    text = (ROOT / "templates" / "copy.cu.j2").read_text()
    (templates / "copy.cu.j2").write_text(text + "\n{% if vec == 2 %}this is not C++;{% endif %}\n")
    proc = tuner(
        "check",
        "copy",
        "--sample",
        "20",
        "--json",
        env={"TUNER_CACHE_DIR": str(tmp_path / "cache"), "TUNER_TEMPLATES": str(templates)},
    )
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["failed"] > 0 and all(c["params"]["vec"] == 2 for c in report["configs"] if "failure" in c)


def test_check_says_each_distinct_error_once_with_its_count(tmp_path):
    templates = tmp_path / "templates"
    templates.mkdir()
    text = (ROOT / "templates" / "copy.cu.j2").read_text()
    (templates / "copy.cu.j2").write_text(
        text + "\n{% if vec == 2 %}this is not C++;{% elif vec == 4 %}__device__ int k = no_such_name;{% endif %}\n"
    )
    env = {"TUNER_CACHE_DIR": str(tmp_path / "cache"), "TUNER_TEMPLATES": str(templates)}
    check = ("check", "copy", "--sample", "30", "--seed", "1", "--jobs", "1")  # --jobs 1: tests/README.md
    report = json.loads(tuner(*check, "--json", env=env).stdout)
    failed = [c for c in report["configs"] if "failure" in c]
    by_vec = {v: sum(c["params"]["vec"] == v for c in failed) for v in (2, 4)}
    assert by_vec[2] > 1 and by_vec[4] > 1 and len(failed) == by_vec[2] + by_vec[4]
    assert sorted(e["configs"] for e in report["errors"]) == sorted(by_vec.values())

    proc = tuner(*check, env=env)  # a pipe: rows out, notes on stderr
    assert proc.returncode == 1
    header, *rows = proc.stdout.splitlines()
    assert len(rows) == report["compiled"] and all(row.endswith(("ok", "spills")) for row in rows)
    errors = [line for line in proc.stderr.splitlines() if " configs: NVRTC: " in line]
    assert len(errors) == 2, proc.stderr
    assert any(line.startswith(f"{by_vec[4]} configs: ") and "no_such_name" in line for line in errors)
    assert all("<uri>.cu(" in line and "(first: copy_" in line for line in errors)


@pytest.mark.parametrize(
    "args, fragments",
    [
        (("render", "no_such_space"), ["no_such_space", "no such space file"]),
        (("render", "transpose", "--set", "wibble=1"), ["transpose.yaml", "--set wibble: unknown parameter"]),
        (("render", "transpose", "--set", "pad=77"), ["transpose.yaml", "value outside the space"]),
        (("check", "transpose", "--sample", "0"), ["--sample", "must be ≥ 1"]),
        (("check", "transpose", "--jobs", "-3"), ["--jobs"]),
        (("frobnicate",), ["invalid choice"]),
    ],
)
def test_bad_input_is_one_line_exit_2(args, fragments):
    assert_bad_input(tuner(*args), *fragments)


def test_malformed_space_file_is_one_line_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kernel: copy\nparams: {stride: [1, 2}\n")
    cache = tmp_path / "cache"
    assert_bad_input(tuner("check", str(bad), env={"TUNER_CACHE_DIR": str(cache)}), str(bad), "malformed YAML")
    assert not cache.exists()


def test_template_with_undefined_variable_is_one_line(tmp_path):
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "copy.cu.j2").write_text("// copy\n{{ no_such_knob }}\n")
    proc = tuner("render", "copy", env={"TUNER_TEMPLATES": str(templates)})
    assert_bad_input(proc, "copy.cu.j2:2", "no_such_knob")


def test_template_syntax_error_is_one_line(tmp_path):
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "copy.cu.j2").write_text("// copy\n\n{% if %}\n")
    assert_bad_input(
        tuner("check", "copy", "--sample", "1", env={"TUNER_TEMPLATES": str(templates)}), "copy.cu.j2:3", "syntax error"
    )


def test_a_space_file_in_place_of_the_kernel_names_its_family(tmp_path):
    space = tmp_path / "my_transpose.yaml"
    space.write_text((ROOT / "search_spaces" / "transpose.yaml").read_text())
    recording = ROOT / "tests" / "data" / "transpose_h200.db"
    url = f"sqlite:///{tmp_path}/s.db"
    proc = tuner("study", str(space), "--trials", "4", "--replay", str(recording), "--storage", url, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["trials"] == 4 and summary["study"].startswith("transpose-")
    assert_bad_input(tuner("study", str(tmp_path / "missing.yaml"), "--trials", "4"), "missing.yaml")
