"""What a person reads: tables fitted to the terminal, plain rows for a pipe.

Text meant to be copied (a `tuner render … --set …` command, a uri) is never wrapped or cut. In a terminal a
table grows past the window rather than fold such a column (the terminal soft-wraps the long line and copying
gives it back whole), and its other columns wrap to fit, between words; a table with more columns than fit (a
lesson's) may be printed as several, each repeating the column that names its rows. When stdout is not a
terminal (`tuner best … | cat`), tables are plain rows, one line each, fields separated by tabs under a header
line; the title and notes go to stderr, so what a pipe receives is only the rows.
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
    title: str,
    columns: Sequence[Column],
    rows: Iterable[Sequence[Cell]],
    notes: Sequence[str] = (),
    key_columns: int = 0,
    wrap_notes: bool = False,
) -> None:
    """Print `rows` under `columns`: a rich table in a terminal, tab-separated plain rows otherwise (see the
    module docstring). Cells are plain text (a `Text` may carry a style); nothing in them is read as markup.

    With `key_columns` (> 0), a table too wide for the terminal even with its columns wrapped is printed as
    several tables, each repeating the first `key_columns` columns (what names a row) beside as many of the
    others as fit, instead of growing past the window. A pipe still gets one table of every column. Notes are
    printed whole (the terminal soft-wraps them: a uri in one copies whole) unless `wrap_notes` (prose)."""
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

    console = Console()
    groups = _column_groups(columns, rows, key_columns, console.width) if key_columns else [list(range(len(columns)))]
    for n, group in enumerate(groups):
        extents = [_extent(columns[i], [row[i] for row in rows]) for i in group]
        # Past the window only where whole words (a copied column: whole cells) need it; the terminal
        # soft-wraps the long lines, and copying gives them back whole.
        width = max(console.width, _table_width([narrowest for narrowest, _ in extents]))
        table = _rich_table(
            f"{title} (continued)" if n and title else title, columns, rows, group, _layout(extents, width)
        )
        (console if width == console.width else Console(width=width)).print(table)
    for note in notes:
        console.print(Text(note), soft_wrap=not wrap_notes)


def _extent(column: Column, cells: Sequence[Cell]) -> tuple[int, int]:
    """(narrowest, widest) a column's text can be drawn: its longest word and its longest cell (header
    included); a copied column is never wrapped, so its longest cell both."""
    texts = [column.name, *(_plain(cell) for cell in cells)]
    widest = max(len(text) for text in texts)
    if column.copy:
        return widest, widest
    return max([1] + [len(word) for text in texts for word in text.split()]), widest


def _table_width(content: Sequence[int]) -> int:
    """The width of a rich table (its default box and padding) whose columns' text is `content` wide: one
    space each side of each column and a border between and around them."""
    return sum(content) + 3 * len(content) + 1


def _layout(extents: Sequence[tuple[int, int]], width: int) -> list[int]:
    """The text width of each column of a table `width` wide: every column at its widest where they all fit.
    Else each at its narrowest (its longest word) and, the columns that need least room first, as many as the
    room left allows at their widest (a row label, a number: one line per row again); the columns that still
    wrap share what remains; where not even the narrowest fit, the narrowest. (rich's own collapse narrows the
    widest columns first, below their longest word: "predicte|d".)"""
    narrowest, widest = [n for n, _ in extents], [w for _, w in extents]
    if _table_width(widest) <= width:
        return widest
    room = max(0, width - _table_width(narrowest))
    widths = list(narrowest)
    for i in sorted(range(len(extents)), key=lambda i: widest[i] - narrowest[i]):
        if widest[i] - narrowest[i] <= room:
            room -= widest[i] - widths[i]
            widths[i] = widest[i]
    wrapping = [i for i in range(len(extents)) if widths[i] < widest[i]]
    wants = sum(widest[i] - widths[i] for i in wrapping)  # > 0: not all fit at their widest
    shares = {i: room * (widest[i] - widths[i]) // wants for i in wrapping}
    left = room - sum(shares.values())
    for k, i in enumerate(wrapping):  # what the rounding down left, a character each
        widths[i] += shares[i] + (k < left)
    return widths


def _rich_table(
    title: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    group: Sequence[int],
    widths: Sequence[int],
):
    """A rich Table of the columns `group` (indices into `columns`) of `rows`, each column `widths` wide (its
    text, padding apart)."""
    from rich.table import Table

    table = Table(title=title)
    for width, i in zip(widths, group, strict=True):
        col = columns[i]  # a copied column is as wide as its widest cell (`_extent`), and never wrapped
        table.add_column(
            col.name, justify=col.justify, width=width, no_wrap=col.copy, overflow="ignore" if col.copy else "fold"
        )
    for row in rows:
        table.add_row(*(row[i] if isinstance(row[i], Text) else Text(str(row[i])) for i in group))
    return table


def _column_groups(
    columns: Sequence[Column], rows: Sequence[Sequence[Cell]], key_columns: int, width: int
) -> list[list[int]]:
    """The columns split into groups, in order, each the first `key_columns` plus as many following columns as a
    table `width` wide holds with whole words (at least one each, however wide)."""
    extents = [_extent(col, [row[i] for row in rows]) for i, col in enumerate(columns)]
    keys = list(range(min(key_columns, len(columns))))
    groups: list[list[int]] = []
    group = list(keys)
    for i in range(len(keys), len(columns)):
        if len(group) > len(keys) and _table_width([extents[j][0] for j in [*group, i]]) > width:
            groups.append(group)
            group = list(keys)
        group.append(i)
    groups.append(group)
    return groups


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
