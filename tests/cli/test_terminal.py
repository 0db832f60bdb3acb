"""The command line as a person uses it: in a pseudo-terminal (pexpect), through a pipe, from another directory;
studies found by name; the documented command list against the parser."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"
SMALL = ROOT / "tests" / "data" / "transpose_h200_tpe40.db"
RECORDED_STUDY = "transpose-n16384_float32-NVIDIA_H200"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def tuner(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`tuner ARGS` through pipes (stdout is not a terminal), importing this checkout from any directory."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
    )


@pytest.fixture
def elsewhere(tmp_path):
    """A directory far from the repository, with a default storage holding the recorded study under a file name
    unlike the study's, and a second database outside the default storage."""
    (tmp_path / "studies").mkdir()
    shutil.copy(RECORDING, tmp_path / "studies" / "recorded.db")
    (tmp_path / "runs").mkdir()
    shutil.copy(SMALL, tmp_path / "runs" / "s1.db")
    return tmp_path


# ---------------------------------------------------------------------------------------------------------------
# finding studies


def test_results_commands_find_a_study_by_name_in_the_default_storage(elsewhere):
    proc = tuner("best", RECORDED_STUDY, "--json", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["study"] == RECORDED_STUDY
    proc = tuner("pareto", RECORDED_STUDY, cwd=elsewhere)
    assert proc.returncode == 0 and "transpose_tile" in proc.stdout, proc.stderr


def test_studies_lists_the_default_storage_and_a_given_one(elsewhere):
    proc = tuner("studies", "--json", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["name"] == RECORDED_STUDY and row["kernel"] == "transpose" and row["problem"] == "n16384"
    assert row["gpu"] == "NVIDIA H200" and row["trials"] >= row["measured"] > 0 and row["unit"] == "TB/s"
    assert 3.5 < row["best"] < 4.3 and row["last_change"].startswith("20")
    assert row["storage"].endswith("studies/recorded.db")

    proc = tuner("studies", "--storage", "runs/s1.db", cwd=elsewhere)  # plain rows to a pipe
    assert proc.returncode == 0, proc.stderr
    header, *rows = proc.stdout.splitlines()
    assert header.split("\t") == ["name", "kernel", "problem", "GPU", "trials", "best", "last change", "storage"]
    assert len(rows) == 1 and rows[0].split("\t")[0] == RECORDED_STUDY and rows[0].split("\t")[4] == "40"


def test_unknown_study_lists_what_is_there(elsewhere):
    proc = tuner("best", "t1", cwd=elsewhere)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("tuner: error: unknown study 't1'") and RECORDED_STUDY in line and "--storage" in line
    proc = tuner("trials", "t1", "--out", "t.csv", "--storage", "runs/s1.db", cwd=elsewhere)
    assert proc.returncode == 2 and "it holds: " + RECORDED_STUDY in proc.stderr
    assert not (elsewhere / "t.csv").exists()


# ---------------------------------------------------------------------------------------------------------------
# pipes: copied text stays whole


def test_best_through_a_narrow_pipe_keeps_the_command_on_one_line_and_it_runs_anywhere(elsewhere):
    proc = tuner("best", RECORDED_STUDY, cwd=elsewhere, env={"COLUMNS": "40"})
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout
    commands = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("tuner render ")]
    assert len(commands) == 1, proc.stdout
    words = shlex.split(commands[0])
    assert "--problem" in words and words.count("--set") == 5, words  # tile, rows_per_thread, pad, vec, order
    uri = proc.stdout.splitlines()[0].split()[0]
    rendered = tuner(*words[1:], cwd=elsewhere)  # the copied command, from a directory without search_spaces/
    assert rendered.returncode == 0, rendered.stderr
    assert f"{uri}(" in rendered.stdout


def test_check_through_a_narrow_pipe_prints_whole_uris_as_plain_rows(elsewhere):
    proc = tuner(
        "check",
        "search_spaces/transpose.yaml",
        "--sample",
        "4",
        "--seed",
        "3",
        cwd=elsewhere,
        env={"COLUMNS": "40", "TUNER_CACHE_DIR": str(elsewhere / "cache")},
    )
    assert proc.returncode == 0, proc.stderr
    header, *rows = proc.stdout.splitlines()
    assert header.split("\t") == ["uri", "registers", "smem", "spills", "status"]
    assert len(rows) == 4 and "…" not in proc.stdout
    for row in rows:
        uri, registers, *_ = row.split("\t")
        assert re.fullmatch(r"transpose_tile\d+_rpt\d+_pad\d+_vec\d+(_ord(col|diag))?", uri) and int(registers) > 0
    assert "compiled 4, failed 0" in proc.stderr


def test_a_table_in_a_narrow_terminal_wraps_between_words_and_keeps_copied_text_whole(elsewhere):
    """`tuner studies` in a terminal of 60 columns: its table needs more (a study's name is copied whole), and
    the other columns wrap between words, never inside one ("replay:transpos|e_h200.db", "predicte|d")."""
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(
        sys.executable,
        ["-m", "tuner", "studies", "--storage", "runs/s1.db"],
        cwd=str(elsewhere),
        dimensions=(40, 60),
        encoding="utf-8",
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"},
    )
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    lines = [line for line in ANSI.sub("", child.before).splitlines() if line.startswith("│")]  # the one row
    columns = zip(*(line.strip().strip("│").split("│") for line in lines), strict=True)
    cells = [" ".join(part.strip() for part in column if part.strip()) for column in columns]
    assert cells[:4] == [RECORDED_STUDY, "transpose", "n16384", "NVIDIA H200"]
    assert lines[0].split("│")[1].strip() == RECORDED_STUDY  # copied text: whole on one line
    assert "…" not in child.before


# ---------------------------------------------------------------------------------------------------------------
# a replay study in a pseudo-terminal


def test_replay_study_in_a_terminal_shows_live_progress_and_an_honest_summary(tmp_path):
    pexpect = pytest.importorskip("pexpect")
    args = [
        "-m",
        "tuner",
        "study",
        "transpose",
        "--replay",
        str(RECORDING),
        "--trials",
        "40",
        "--seed",
        "3",
        "--replay-delay",
        "0.05",
    ]
    child = pexpect.spawn(
        sys.executable,
        args,
        cwd=str(tmp_path),
        dimensions=(40, 120),
        encoding="utf-8",
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"},
    )
    child.expect(r"trials go to studies/transpose\.db")
    # the live line, colours and all: "study ━━━╸━━ 13/40 0:00:01 best 3.65 TB/s (0.86× ceiling)  25.3 trials/s"
    child.expect(
        r"study\S* \S+ \S*?(\d+)/40\S* \S*?\d:\d\d:\d\d\S* best \d\.\d\d TB/s \(0\.\d\d× ceiling\) +"
        r"\d+\.\d trials/s"
    )
    live = int(child.match.group(1))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    screen = ANSI.sub("", child.before)
    assert live < 40  # seen while the study ran, not only at its end
    assert "40/40" in screen
    table = screen[screen.index("study transpose-") :]
    assert "replay workers busy" in table and "GPU busy" not in table
    assert "TFLOP/s" not in table
    # The table's cells may fold over lines: read them as one text.
    text = " ".join(table.replace("│", " ").split())
    assert re.search(
        r"best transpose_tile\d+_rpt\d+_pad\d+_vec\d+(_ord(col|diag))? \d\.\d{3} TB/s, 0\.\d\d× the copy ceiling, "
        r"\d+ registers",
        text,
    ), text
    wall = re.search(
        r"wall time (\d+\.\d+) s \(the study's loop \S+ s\); first result at (\d+\.\d+) s: start-up (\d+\.\d+) s "
        r"\(imports "
        r"\S+ s(?:, Ray \S+ s)?, workers \S+ s\), then \S+ s opening the study and answering the first "
        r"config",
        text,
    )
    assert wall, text
    # both from the command's start: the first result comes within the whole wall
    assert float(wall.group(3)) <= float(wall.group(2)) <= float(wall.group(1))
    assert (tmp_path / "studies" / "transpose.db").is_file()


# ---------------------------------------------------------------------------------------------------------------
# help


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _readme_commands() -> dict[str, str]:
    """docs/commands.md's command block: command → its synopsis (continuation lines joined, comments dropped)."""
    text = (ROOT / "docs" / "commands.md").read_text()
    section = text[text.index("# Commands") :]
    section = section[: section.index("\n## ")]
    commands: dict[str, str] = {}
    current = None
    for line in section.splitlines():
        if not line.startswith("    "):
            current = None
            continue
        body = line.split("#", 1)[0].strip()
        if body.startswith("tuner "):
            current = body.split()[1]
            commands[current] = body
        elif current is not None and body:
            commands[current] += " " + body
    return commands


def test_readme_command_list_matches_the_parser():
    parser = build_parser()
    readme = _readme_commands()
    subs = _subparsers(parser)
    assert set(readme) == set(subs) | {"--version"}
    for name, sub in subs.items():
        usage = sub.format_usage()
        parser_options = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", usage)) - {"--help"}
        readme_options = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", readme[name]))
        assert readme_options == parser_options, (name, readme_options ^ parser_options)
        positionals = [word.strip("[]") for word in usage.split() if re.fullmatch(r"\[?[a-z_]+\]?", word)]
        for word in positionals[2:]:  # after "usage: tuner NAME"
            assert word.upper() in readme[name] or word == "name", (name, word)


def test_version_and_completion(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "--version"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert proc.returncode == 0 and re.fullmatch(r"tuner \d+\.\d+\.\d+\S*\n", proc.stdout), proc
    assert "PYTHON_ARGCOMPLETE_OK" in (ROOT / "tuner" / "cli" / "main.py").read_text()[:1024]
    pytest.importorskip("argcomplete")
    # argcomplete's protocol: the shell sets these and reads the candidates back (here from a file).
    out = tmp_path / "candidates"
    line = "tuner st"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "tuner"], env=env, cwd=tmp_path, timeout=60, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    candidates = set(out.read_text().split())
    assert {"study", "studies"} <= candidates and "best" not in candidates


def test_a_command_names_a_shipped_space_only_when_the_study_ran_on_that_very_file():
    from tuner.results import studies
    from tuner.space import space as space_mod

    recorded = "/some/other/checkout/search_spaces/transpose.yaml"
    assert studies._space_argument(recorded, space_mod.load("transpose").content_hash()) == "transpose"
    assert studies._space_argument(recorded, "0" * 64) == recorded  # an edited copy: its own path
    assert studies._space_argument("mine/t.yaml", "") == "mine/t.yaml"
