"""``--image PATH`` pinned by content at submission: a pending or requeued job runs the
image it was submitted with, whatever later happens to the file.

The image is copied once per content into ``$KIT_HOME/images/sha256-<hex>.sqsh``
(read-only) and the job names that copy. A memo of (device, inode, size, mtime,
ctime) -> digest lets a second submission of an unchanged file skip reading it.
A copy, not a hard link: ``mksquashfs`` appends to an existing output file in
place, which a hard link would see.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from pathlib import Path

from kit import files
from kit.errors import KitError
from kit.home import kit_home

RACY = 2.0  # seconds: a file this fresh may change within its time stamp; not memoized


def pins() -> Path:
    return kit_home() / "images"


def pin(image: Path, label: str = "--image") -> tuple[Path, str]:
    """(the pinned copy's path, ``sha256:<hex>``) of the image file ``image``."""
    directory = pins()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    st_dir = os.lstat(directory)
    if not stat.S_ISDIR(st_dir.st_mode) or st_dir.st_uid != os.geteuid() or st_dir.st_mode & 0o022:
        raise KitError(f"{directory} is not a directory of this user's own", field=label,
                       hint="set KIT_HOME to a directory of your own")
    image = Path(image).absolute()
    if image.parent == directory and image.name.startswith("sha256-") and image.is_file():
        return image, "sha256:" + image.name.removeprefix("sha256-").removesuffix(".sqsh")  # pinned already
    memo_path = directory / "memo.json"
    try:
        memo = files.read_json(memo_path)
        memo = memo if isinstance(memo, dict) else {}
    except (OSError, ValueError):
        memo = {}
    with files.open_regular(image, follow=True) as (fd, st):
        key = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        entry = memo.get(str(image))
        if isinstance(entry, list) and len(entry) == 6 and entry[:5] == key and isinstance(entry[5], str):
            pinned = directory / f"sha256-{entry[5]}.sqsh"
            if pinned.is_file():
                return pinned, "sha256:" + entry[5]
        digest = _copy(fd, directory)
    if time.time() - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > RACY:
        memo[str(image)] = [*key, digest]
        with contextlib.suppress(OSError):
            files.write_atomic(memo_path, json.dumps(memo), 0o600)
    return directory / f"sha256-{digest}.sqsh", "sha256:" + digest


def _copy(fd: int, directory: Path) -> str:
    """Copy the open file into ``directory`` under its digest (kept once); the digest."""
    try:
        return files.keep_by_content(fd, directory, lambda digest: f"sha256-{digest}.sqsh")
    except OSError as e:
        raise KitError(f"cannot keep a copy of the image in {directory}: {e.strerror}", field="--image", exit_code=1,
                       hint="free space there (kit pins --image by content so a rebuild cannot change a "
                            "pending job)") from None
