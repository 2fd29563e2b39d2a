"""What an image names: a registry reference (``docker://…``, pulled by enroot) or a squashfs file (by its magic bytes). Light on purpose: the command line reads it at start-up."""

from __future__ import annotations

import re
from pathlib import Path

SQUASHFS_MAGIC = b"hsqs"


# docker://[USER@][REGISTRY#]IMAGE[:TAG]
REGISTRY_REF = re.compile(r"docker://(([^@/#]+)@)?(([^#]+)#)?([a-z0-9/._-]+)(:([A-Za-z0-9._:-]+))?\Z")


def is_reference(image: str) -> bool:
    """A registry reference (``docker://…``, pulled by enroot; any scheme is one, checked against
    :data:`REGISTRY_REF`), not an image file: the one test of it."""
    return "://" in image


def is_squashfs(path: str | Path) -> bool:
    """Whether ``path`` is a squashfs image (by its magic bytes)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == SQUASHFS_MAGIC
    except OSError:
        return False
