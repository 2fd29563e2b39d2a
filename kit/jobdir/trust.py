"""Whose a job directory's files are, and what kit loads only from its caller's own: a pickle is code (function calls and results), checked on the descriptor read."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from kit import files
from kit.errors import KitError
from kit.jobdir.layout import JobDir


def owner(path: Path) -> int | None:
    """The uid owning ``path`` (never through a symlink), None when it cannot be read."""
    try:
        return os.lstat(path).st_uid
    except OSError:
        return None


def owner_name(uid: int | None) -> str:
    """A uid as a person reads it: the login name, else ``uid N``."""
    try:
        return pwd.getpwuid(uid).pw_name if uid is not None else "an unknown user"
    except KeyError:
        return f"uid {uid}"


def replaceable_by_others(st: os.stat_result, *, sticky_ok: bool) -> str | None:
    """Why a directory (``st``, not through a symlink) lets someone other than this user and root replace what lies
    in it — its owner is another user, or others can write it (without the sticky bit, where ``sticky_ok``) — or
    None when it does not. What kit runs from a directory is only as much the user's as the directory is."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"it is {owner_name(st.st_uid)}'s"
    if st.st_mode & 0o022 and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        sticky = ", without the sticky bit" if sticky_ok else ""
        return f"others can write it (mode {st.st_mode & 0o7777:04o}{sticky})"
    return None


def own(path: Path) -> Path:
    """``path`` when this user owns it and no one else can write it: a pickle is code, and a
    result is loaded only from a job directory of the caller's own (root included)."""
    _check_own(path, os.lstat(path))
    return path


def _check_own(path: Path, st: os.stat_result) -> None:
    """:class:`KitError` unless ``st`` (of ``path``) is this user's and no one else's to write."""
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise KitError(
            f"{path} is not this user's own (owner uid {st.st_uid}, or others can write it): kit "
            "neither runs nor loads what it holds",
            field="JOB",
            hint="rerun a job, or read its results, as the user who submitted it",
        )


def read_own(path: Path, limit: int) -> bytes:
    """The regular file ``path`` (never through a symlink), at most ``limit`` bytes, when this user owns it and no
    one else can write it — checked on the very file read (its descriptor), not on the path looked at again."""
    try:
        with files.open_regular(path) as (fd, st):
            _check_own(path, st)
            if st.st_size > limit:
                raise KitError(
                    f"{path} holds {st.st_size} bytes, more than the {limit} kit loads",
                    field="JOB",
                    hint="return less (write large outputs to files and return their paths)",
                )
            return files.read_fd(fd, limit)
    except OSError as e:
        raise KitError(
            f"cannot read {path}: {e.strerror}",
            field="JOB",
            hint="a function job's results are the files its ranks wrote, nothing else",
        ) from None


def function_payloads(source: Path) -> dict[Path, bytes]:
    """A function job's pickled calls (the job's, or each ``kit.map`` task's), relative to its
    directory (``kit rerun`` writes them again): read only from files of the caller's own (a
    pickle is code)."""
    out = {}
    for unit in [JobDir(source), *(JobDir(source).task(i) for i in JobDir(source).task_indices())]:
        path = unit / JobDir.FUNCTION
        if os.path.lexists(path):
            try:
                out[path.relative_to(source)] = files.read_bytes(own(path), 1 << 31)
            except OSError as e:
                raise KitError(f"cannot read {path}: {e.strerror}", field="JOB") from None
    return out
