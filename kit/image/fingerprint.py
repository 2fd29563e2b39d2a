"""What a build's cache keys hold of its inputs: a base root filesystem's names, modes, sizes and
mtimes (as make does), and what a copy step copies, contents included (as Docker keys COPY).
Remembered for one build (its stages share bases), never longer: :func:`forget`."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from kit.image import ignore
from kit.runner import run


def forget() -> None:
    REMEMBERED.clear()


def of_path(path: Path) -> str:
    key = str(path)
    if key not in REMEMBERED:  # one walk per path and build: stages share bases
        REMEMBERED[key] = _walk(path)
    return REMEMBERED[key]


REMEMBERED: dict = {}


def _walk(path: Path) -> str:
    """A hash of names, types, modes, sizes and mtimes under ``path`` (a base root
    filesystem: not contents, as make does)."""
    if not path.exists() and not path.is_symlink():
        return f"missing {path}"
    if path.is_file() or path.is_symlink():
        st = path.lstat()
        return f"{path} {st.st_mode} {st.st_size} {st.st_mtime_ns}"
    # find(1) walks a 10k-file root filesystem several times faster than os.walk.
    out = run(["find", str(path), "-printf", "%y%m %s %T@ %P\\0"], what="build", timeout=None).stdout
    return hashlib.sha256("\0".join(sorted(out.split("\0"))).encode(errors="surrogateescape")).hexdigest()


def of_source(src: Path, keep=None) -> str:
    """What a copy step copies: every entry's name, type, mode, size, mtime and, for
    files, content (as Docker keys COPY): a changed source rebuilds its step, even one
    whose size and mtime were kept. ``keep(relpath)``: the entries that count."""
    key = ("source", str(src), keep)
    if key in REMEMBERED:
        return REMEMBERED[key]
    h = hashlib.sha256()

    def entry(path: Path, rel: str) -> None:
        try:
            st = path.lstat()
        except OSError:
            h.update(f"missing {rel}\0".encode(errors="surrogateescape"))
            return
        h.update(f"{rel}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0".encode(errors="surrogateescape"))
        if stat.S_ISLNK(st.st_mode):
            h.update(os.readlink(path).encode(errors="surrogateescape"))
        elif stat.S_ISREG(st.st_mode):
            with open(path, "rb", buffering=0) as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)

    entry(src, "")
    if src.is_dir() and not src.is_symlink():
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames.sort()
            for name in sorted(dirnames + filenames):
                path = Path(dirpath) / name
                rel = path.relative_to(src).as_posix()
                if keep is None or keep(rel):
                    entry(path, rel)
    REMEMBERED[key] = h.hexdigest()
    return REMEMBERED[key]


def of_add(value: dict) -> str:
    """A Dockerfile COPY/ADD source, as far as .dockerignore lets it in."""
    src = Path(value["src"])
    if not value.get("ignore"):
        return of_source(src)
    rules = ignore.Ignore(value["ignore"])
    top = src.relative_to(value["context"]).as_posix()
    return of_source(src, keep=lambda rel: not rules.excluded(f"{top}/{rel}" if rel else top))
