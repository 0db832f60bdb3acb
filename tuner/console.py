"""What a person reads: tables fitted to the terminal, plain rows for a pipe, times rounded for people.

Text meant to be copied (a `tuner render … --set …` command, a uri) is never wrapped or cut. In a terminal a
table grows past the window rather than fold such a column (the terminal soft-wraps the long line and copying
gives it back whole), and its other columns wrap to fit. When stdout is not a terminal (`tuner best … | cat`),
tables are plain rows, one line each, fields separated by tabs under a header line; the title and notes go to
stderr, so what a pipe receives is only the rows.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich.console import JustifyMethod
from rich.text import Text

Cell = str | Text


@dataclass(frozen=True)
class Column:
    name: str
    justify: JustifyMethod = "left"
    #: text a person copies (commands, uris, names): never wrapped or cut
    copy: bool = False


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def _plain(cell: Cell) -> str:
    text = cell.plain if isinstance(cell, Text) else str(cell)
    return " ".join(text.split())  # one field, one line: a tab or newline inside would split it


def print_table(
    title: str, columns: Sequence[Column], rows: Iterable[Sequence[Cell]], notes: Sequence[str] = ()
) -> None:
    """Print `rows` under `columns`: a rich table in a terminal, tab-separated plain rows otherwise (see the
    module docstring). Cells are plain text (a `Text` may carry a style); nothing in them is read as markup."""
    rows = [list(r) for r in rows]
    if not stdout_is_terminal():
        if title:
            print(title, file=sys.stderr)
        print("\t".join(c.name for c in columns))
        for row in rows:
            print("\t".join(_plain(cell) for cell in row))
        sys.stdout.flush()
        for note in notes:
            print(note, file=sys.stderr)
        return

    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    table = Table(title=title)
    for i, col in enumerate(columns):
        if col.copy:
            widest = max([len(col.name)] + [len(_plain(r[i])) for r in rows])
            table.add_column(col.name, justify=col.justify, no_wrap=True, overflow="ignore", min_width=widest)
        else:
            table.add_column(col.name, justify=col.justify, overflow="fold")
    for row in rows:
        table.add_row(*(cell if isinstance(cell, Text) else Text(str(cell)) for cell in row))
    console = Console()
    unbounded = Console(width=100_000)
    needed = Measurement.get(unbounded, unbounded.options, table).minimum
    if needed > console.width:
        console = Console(width=needed)
    console.print(table)
    for note in notes:
        console.print(Text(note), soft_wrap=True)


def print_lines(lines: Iterable[Cell]) -> None:
    """Lines of a report, each printed whole: rich styles in a terminal (never re-wrapped: the terminal
    soft-wraps), plain text to a pipe."""
    if not stdout_is_terminal():
        for line in lines:
            print(line.plain if isinstance(line, Text) else line)
        return
    from rich.console import Console

    console = Console(highlight=False)
    for line in lines:
        console.print(line if isinstance(line, Text) else Text(line), soft_wrap=True)


def human_seconds(seconds: float | None) -> str:
    """A duration as a person reads it: 0.42 s, 5.9 s, 13.6 s, 2 min 05 s; "?" for None."""
    if seconds is None:
        return "?"
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"
