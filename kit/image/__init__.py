"""`kit build`: recipes (:mod:`kit.image.recipe`) into squashfs images (:mod:`kit.image.builder`).

Kept light on purpose: the command line imports the recipe tables at start-up
and the build machinery only when it builds.
"""

from __future__ import annotations

import re
from pathlib import Path

SQUASHFS_MAGIC = b"hsqs"
# An image in a registry, as `enroot import` (and pyxis's --container-image) name it:
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
