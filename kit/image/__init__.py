"""`kit build`: recipes (:mod:`kit.image.recipe`) into squashfs images (:mod:`kit.image.builder`).

Kept light on purpose: the command line imports the recipe tables at start-up
and the build machinery only when it builds.
"""

from __future__ import annotations

from pathlib import Path

SQUASHFS_MAGIC = b"hsqs"


def is_squashfs(path: str | Path) -> bool:
    """Whether ``path`` is a squashfs image (by its magic bytes)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == SQUASHFS_MAGIC
    except OSError:
        return False
