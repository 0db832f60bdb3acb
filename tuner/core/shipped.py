"""What ships: the package's version (`VERSION`), and where the shipped kernel templates and search spaces are:
inside the package of an installed wheel, at the top of a source checkout (and of an editable install of one).

The repository keeps them at its top, ``templates/`` and ``search_spaces/``, where a user opens and copies them;
the wheel carries them as package data, mapped into the package at build time (pyproject.toml), so an installed
tuner finds them from any directory.
"""

from __future__ import annotations

from pathlib import Path

#: the package's version (`tuner.__version__`), written into exported headers
VERSION = "0.1.0"

#: the package's folder (this module sits in its `core` folder)
PACKAGE = Path(__file__).resolve().parents[1]


def shipped_dir(name: str) -> Path:
    """The folder of shipped files `name` (``templates`` or ``search_spaces``)."""
    packaged = PACKAGE / name
    # A folder that holds files: an empty one left in a source tree (a checkout from before the move, a copy that
    # dropped the files but kept the folders) is not the wheel's
    if packaged.is_dir() and any(f.is_file() for f in packaged.iterdir()):
        return packaged
    return PACKAGE.parent / name
