"""`kit build`: recipes (:mod:`kit.image.recipe`) into squashfs images (:mod:`kit.image.builder`).

Kept light on purpose: the command line imports the recipe tables at start-up and the build machinery only when it
builds; what an image name is lives in :mod:`~kit.image.reference`.
"""

from kit.image.reference import REGISTRY_REF, SQUASHFS_MAGIC, is_reference, is_squashfs

__all__ = ["REGISTRY_REF", "SQUASHFS_MAGIC", "is_reference", "is_squashfs"]
