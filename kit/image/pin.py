"""``--image PATH`` pinned by content at submission: a pending or requeued job runs the
image it was submitted with, whatever later happens to the file.

The image is copied once per content into ``$KIT_HOME/images/sha256-<hex>.sqsh``
(read-only) and the job names that copy. A memo of (device, inode, size, mtime,
ctime) -> digest lets a second submission of an unchanged file skip reading it.
A copy, not a hard link: ``mksquashfs`` appends to an existing output file in
place, which a hard link would see.
"""

from __future__ import annotations

from pathlib import Path

from kit import files
from kit.errors import KitError
from kit.home import kit_home

def pins() -> Path:
    return kit_home() / "images"


def pin(image: Path, label: str = "--image") -> tuple[Path, str]:
    """(the pinned copy's path, ``sha256:<hex>``) of the image file ``image``."""
    directory = pins()
    if not files.own_directory(directory):
        raise KitError(f"{directory} is not a directory of this user's own", field=label,
                       hint="set KIT_HOME to a directory of your own")
    image = Path(image).absolute()
    if image.parent == directory and image.name.startswith("sha256-") and image.is_file():
        return image, "sha256:" + image.name.removeprefix("sha256-").removesuffix(".sqsh")  # pinned already
    memo = files.StatMemo(directory / "memo.json")
    with files.open_regular(image, follow=True) as (fd, st):
        known = memo.get(image, st)
        if known and (directory / f"sha256-{known}.sqsh").is_file():
            return directory / f"sha256-{known}.sqsh", "sha256:" + known
        digest = _copy(fd, directory)
    memo.put(image, st, digest)
    memo.save()
    return directory / f"sha256-{digest}.sqsh", "sha256:" + digest


def _copy(fd: int, directory: Path) -> str:
    """Copy the open file into ``directory`` under its digest (kept once); the digest."""
    try:
        return files.keep_by_content(fd, directory, lambda digest: f"sha256-{digest}.sqsh")
    except OSError as e:
        raise KitError(f"cannot keep a copy of the image in {directory}: {e.strerror}", field="--image", exit_code=1,
                       hint="free space there (kit pins --image by content so a rebuild cannot change a "
                            "pending job)") from None
