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


def pin(image: Path, label: str = "--image", copy: bool = True) -> tuple[Path, str]:
    """(the pinned copy's path, ``sha256:<hex>``) of the image file ``image``. A pinned copy is
    trusted while it is the very file kit checked (inode, size and times unchanged), else read
    again: one whose content is not its name is replaced from ``image``, or refused. Without
    ``copy`` (a dry run) nothing is copied: (``image``, its digest)."""
    directory = pins()
    image = Path(image).absolute()
    try:
        with files.owned(directory) as here:
            memo = files.StatMemo(here / "memo.json")
            if image.parent == directory and image.name.startswith("sha256-"):  # a rerun's pinned copy
                digest = image.name.removeprefix("sha256-").removesuffix(".sqsh")
                if not files.verify(here / image.name, digest, memo, key=image.name):
                    raise KitError(
                        f"the pinned image {image} does not hold what its name says (changed or replaced)",
                        field=label,
                        exit_code=1,
                        hint="give the image file again: --edit image=PATH",
                    )
                memo.save()
                return image, "sha256:" + digest
            with files.open_regular(image, follow=True) as (fd, st):
                known = memo.get(image, st)
                name = f"sha256-{known}.sqsh"
                if known and not copy:
                    return image, "sha256:" + known
                if known and files.verify(here / name, known, memo, key=name):
                    memo.save()
                    return directory / name, "sha256:" + known
                digest = files.sha256_of(fd) if not copy else _copy(fd, here, memo)
            memo.put(image, st, digest)
            if copy:  # the copy kit just wrote from what it hashed: trusted while it stays that file
                with files.open_regular(here / f"sha256-{digest}.sqsh") as (_, written):
                    memo.put(f"sha256-{digest}.sqsh", written, digest, written=True)
            memo.save()
    except files.NotOwned:
        raise KitError(
            f"{directory} is not a directory of this user's own",
            field=label,
            hint="set KIT_HOME to a directory of your own",
        ) from None
    if not copy:
        return image, "sha256:" + digest
    return directory / f"sha256-{digest}.sqsh", "sha256:" + digest


def _copy(fd: int, directory: Path, memo: files.StatMemo) -> str:
    """Copy the open file into ``directory`` under its digest (kept once, a damaged copy
    replaced); the digest."""
    try:
        return files.keep_by_content(
            fd,
            directory,
            lambda digest: f"sha256-{digest}.sqsh",
            keep=lambda path, d: files.verify(path, d, memo, key=path.name),
        )
    except OSError as e:
        raise KitError(
            f"cannot keep a copy of the image in {pins()}: {e.strerror}",
            field="--image",
            exit_code=1,
            hint="free space there (kit pins --image by content so a rebuild cannot change a pending job)",
        ) from None
