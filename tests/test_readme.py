"""The README and docs/ as a newcomer reads them: short, their commands real, their links alive, and
benchmarks/README.md what benchmarks/results/ says (no GPU needed)."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from tuner.cli.main import build_parser
from tuner.core.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/python -m pytest -q"
MAIN_JOB = "tuner study gemm --space search_spaces/gemm.yaml --trials 500"

# A word that stands for a value the reader supplies: SPACE, N, FILE.png, HEAD_IP:6379, [--flag], "…".
PLACEHOLDER = re.compile(r"\[|\]|…|\.\.\.|^[A-Z][A-Z0-9_:.]*(\.[a-z.]+)?$")


def _code_lines(text: str) -> list[str]:
    """Lines of fenced blocks and of indented blocks (four spaces after a blank line or another such line)."""
    lines, fenced, indented = [], False, False
    previous_blank = True
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            lines.append(line)
        elif line.startswith("    ") and (previous_blank or indented):
            indented = True
            lines.append(line)
        else:
            indented = False
        previous_blank = not line.strip()
    return lines


def _commands(path: Path) -> list[tuple[str, bool]]:
    """Every `tuner ...` command on a page: (its words after `tuner`, whether it is written out in full).

    Code lines count from their `tuner` (`.venv/bin/tuner ...`, `$ tuner ...`), comments dropped; a line written
    out in full must parse, a synopsis line with [options] or VALUES is checked for its options only. Inline code
    spans that start with `tuner ` name a command in prose (`tuner best`): cut at a pipe or a redirection, they
    are checked for their options only."""
    text = path.read_text()
    found = []
    for line in _code_lines(text):
        match = re.search(r"(?:^|[\s/])tuner\s+(-?-?[a-z][\w-]*.*)$", line.split(" #", 1)[0].strip())
        if match:
            words = match.group(1).strip()
            found.append((words, not any(PLACEHOLDER.search(w) for w in words.split())))
    for span in re.findall(r"`([^`]+)`", text.replace("\n", " ")):
        if span.startswith("tuner "):
            found.append((re.split(r"\s[|>]", span)[0][len("tuner ") :].strip(), False))
    return found


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_on_the_page_is_one_the_parser_takes(page):
    parser = build_parser()
    subs = _subcommands(parser)
    commands = _commands(page)
    for words, complete in commands:
        name = words.split()[0]
        if name == "--version":
            continue
        assert name in subs, (page.name, words)
        known = set(subs[name]._option_string_actions)
        options = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", words))
        assert options <= known, (page.name, words, options - known)
        if complete:
            try:
                parser.parse_args(shlex.split(words))
            except (InputError, SystemExit) as exc:
                raise AssertionError(f"{page.name}: `tuner {words}` does not parse: {exc}") from exc


def test_the_pages_hold_commands_and_the_readme_the_ones_ci_runs():
    assert sum(complete for page in PAGES for _, complete in _commands(page)) >= 5
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert TEST_COMMAND in readme
    setup, tests = TEST_COMMAND.rsplit(" && ", 1)  # CI runs the same two steps, a line each
    assert setup + "\n" in ci and "\n" + tests + "\n" in ci
    assert MAIN_JOB in readme
    assert len(readme.encode()) < 12 * 1024
    first_screen = "\n".join(readme.splitlines()[:24])
    assert TEST_COMMAND in first_screen and MAIN_JOB in first_screen


@pytest.mark.parametrize("page", [*PAGES, ROOT / "benchmarks" / "README.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_local_link_on_the_page_exists(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), (page.name, target)


def test_benchmarks_readme_is_what_the_results_say():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "benchmarks" / "readme_tables.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = (ROOT / "benchmarks" / "README.md").read_text()
    assert written == module.render(), "benchmarks/README.md is out of date: run python benchmarks/readme_tables.py"
