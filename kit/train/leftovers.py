"""This user's node tiers of kit's checkpoints that nothing holds any more: a finished job's, which its
keeper removes as the work ends (:func:`clean`), and a cancelled or failed job's, which nothing after it on the
node removes, collected by the next keeper of the user's there once untouched a while (:func:`collect`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from kit import files
from kit.train import snapshots as S


def clean(where: S.Place) -> None:
    """The work is done: the node's tiers go (the shared tier keeps the last state)."""
    for base in S.bases().values():
        with contextlib.suppress(OSError):
            with files.owned(S.user_root(base), create=False) as root:
                files.remove_tree(root / where.key / where.node)
                _drop_if_bare(root / where.key)


def _drop_if_bare(key: Path) -> None:  # a job key with no node left in it goes (its job file with it)
    with contextlib.suppress(OSError):
        if not [p for p in key.iterdir() if p.is_dir()]:
            files.remove_tree(key)


def collect(where: S.Place, now: float | None = None) -> list[str]:
    """This user's tiers on this node of jobs no keeper holds any more (a cancelled job, a failed one: nothing
    after it cleans a node), once untouched for :data:`kit.train.snapshots.IDLE`: removed. What it removed."""
    now, gone = time.time() if now is None else now, []
    for tier, base in S.bases().items():
        with contextlib.suppress(OSError), files.owned(S.user_root(base), create=False) as root:
            for key in os.listdir(root):
                if key == where.key or not (root / key).is_dir():
                    continue
                idle = (root / key).lstat().st_mtime < now - S.IDLE[tier]
                for node in [p for p in (root / key).iterdir() if p.is_dir()]:
                    if not _held(node) and _newest(node) < now - S.IDLE[tier]:
                        files.remove_tree(node)
                        gone.append(f"{base}/{key}/{node.name}")
                        idle = True
                if idle:  # never the key a job starting beside this one has just made, its node's not yet in it
                    _drop_if_bare(root / key)
    return gone


def _held(node: Path) -> bool:
    """Whether a keeper holds one of the node's run locks (``keeper.r<run>``)."""
    for lock in node.glob("keeper.r*"):
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
    return False


def _newest(node: Path) -> float:
    newest = 0.0  # the latest change below the node's directory
    for top, dirs, names in os.walk(node):
        for name in [*dirs, *names]:
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(os.path.join(top, name)).st_mtime)
    return max(newest, node.lstat().st_mtime)
