"""Errors that mean "the user's input is wrong", as opposed to a bug in tuner.

The CLI turns every `InputError` into one line on stderr and exit code 2, with no traceback. Anything else that
escapes is a bug in our own code and keeps its traceback.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad input: a malformed space, an unknown parameter, a template error, a flag out of range.

    `where` names the file (and line, where known) so the message reads ``file:line: fault``.
    """

    def __init__(self, message: str, where: str | None = None, line: int | None = None):
        self.message = message
        self.where = where
        self.line = line
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.where is None:
            return self.message
        if self.line is None:
            return f"{self.where}: {self.message}"
        return f"{self.where}:{self.line}: {self.message}"


class SpaceError(InputError):
    """A search-space file that cannot be loaded, or a config that is not in the space."""


class TemplateError(InputError):
    """A kernel template with a syntax error or a reference to an undefined variable."""
