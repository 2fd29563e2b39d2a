"""Paths inside an image root, resolved the way the image sees them.

Every write kit makes into an image root (archive members, ``copy`` steps)
goes through :func:`inside`: each symlink met on the way is resolved as if
the root were ``/`` (an absolute target starts again at the root, ``..``
stops at it), the same scoping a container runtime applies. A symlink in an
untrusted base image can therefore redirect a write within the image, never
out of it.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path, PurePosixPath

from kit.errors import KitError

MAX_LINKS = 40  # what the kernel allows (ELOOP)


def _parts(name: str) -> list[str]:
    return [p for p in PurePosixPath(name).parts if p not in ("/", "", ".")]


def inside(root: Path, name: str, *, follow_last: bool = False) -> Path:
    """The host path of ``name`` (absolute or relative to the image's ``/``) in ``root``.

    Every component but the last is resolved through symlinks within the
    root; the last is too when ``follow_last``. The result never leaves
    ``root`` and none of its parent components is a symlink.
    """
    pending = _parts(name)
    resolved: list[str] = []
    links = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        here = root.joinpath(*resolved, part)
        if (pending or follow_last) and here.is_symlink():
            links += 1
            if links > MAX_LINKS:
                raise KitError(f"{name}: too many levels of symbolic links in the image")
            target = os.readlink(here)
            if target.startswith("/"):
                resolved = []
            pending = _parts(target) + pending
            continue
        resolved.append(part)
    return root.joinpath(*resolved)


def relative(root: Path, path: Path) -> str:
    """``path`` (a result of :func:`inside`) as the image names it."""
    return "/" + path.relative_to(root).as_posix() if path != root else "/"


def clear(path: Path) -> None:
    """Remove what is at ``path`` (a result of :func:`inside`), not following a symlink."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def copy_into(root: Path, src: Path, dst: Path, skip=None) -> None:
    """Copy ``src`` (a file, symlink or directory tree on the host) to ``dst``
    (a result of :func:`inside`), resolving every path it writes within ``root``.

    Symlinks in ``src`` are copied as symlinks; a directory meets an existing
    directory by merging, anything else is replaced. ``skip(path)``: entries
    under ``src`` to leave out (.dockerignore).
    """
    mode = src.lstat().st_mode
    if stat.S_ISDIR(mode):
        if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
            clear(dst)
        dst.mkdir(parents=True, exist_ok=True)
        for child in sorted(os.listdir(src)):
            if skip is None or not skip(src / child):
                copy_into(root, src / child, inside(root, relative(root, dst / child)), skip)
        shutil.copystat(src, dst, follow_symlinks=False)
    elif stat.S_ISLNK(mode) or stat.S_ISREG(mode):
        clear(dst)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst, follow_symlinks=False)
    else:
        raise KitError(f"{src}: not a file, directory or symlink (a device, FIFO or socket cannot be copied)")


def directory(root: Path, name: str) -> Path:
    """The directory ``name`` in the image, made if missing (through symlinks within the root)."""
    path = inside(root, name, follow_last=True)
    if path.exists() and not path.is_dir():
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_text(root: Path, name: str, text: str) -> Path:
    """Write the file ``name`` in the image, replacing a symlink or file there."""
    path = inside(root, name)
    clear(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
