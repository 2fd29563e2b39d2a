"""Files kit writes and reads where another user may have reached first.

kit runs as root on the local cluster and, for admins, on other users' job
directories, so every file it writes goes through one of three helpers and
every record it reads through one reader:

- :func:`replacing` / :func:`write_atomic`: a private temporary file in the
  same directory (random name, ``O_CREAT|O_EXCL|O_NOFOLLOW``), then a rename
  over the final name. Readers see the old file or the new one, never a part;
  a symlink planted at the final name or at any temporary name is replaced or
  refused, never followed.
- :func:`create`: a file that must not exist yet (``O_EXCL|O_NOFOLLOW``).
- :func:`append`: append to a regular file, never through a symlink.
- :func:`read_bytes` / :func:`read_text` / :func:`read_json` / :func:`tail`:
  a regular file only (a FIFO, a device or a symlink is an ``OSError``, so
  nothing blocks or reads without end), at most ``limit`` bytes; JSON nested
  too deep is a ``ValueError`` like any other damage.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
from pathlib import Path
from typing import IO, Iterator

RECORD_LIMIT = 16 << 20  # a record kit wrote (job.json, runs.jsonl, ...) is far smaller


def safe_name(name: str, limit: int = 40) -> str:
    """``name`` as one path component of letters, digits, ``-``, ``_`` and ``.`` (others become ``_``), at most
    ``limit`` characters, no leading or trailing dot ("" when nothing is left)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:limit].strip(".")


@contextlib.contextmanager
def replacing(path: str | os.PathLike, mode: int = 0o644) -> Iterator[IO[bytes]]:
    """A binary file that becomes ``path`` (with ``mode``) when the block ends
    without an exception; on an exception nothing changes and the temporary
    file is gone."""
    path = Path(path)
    import tempfile  # (here: a command that writes no record does not pay for it)

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # O_EXCL|O_NOFOLLOW, 0600
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: str | os.PathLike, data: str | bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically (see :func:`replacing`)."""
    with replacing(path, mode) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def create(path: str | os.PathLike, data: str | bytes, mode: int = 0o644) -> None:
    """Create ``path`` holding ``data``; it must not exist (``FileExistsError``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        _write_all(fd, data.encode("utf-8") if isinstance(data, str) else data)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)


def append(path: str | os.PathLike, data: str | bytes, mode: int = 0o644) -> None:
    """Append ``data`` to the regular file ``path`` (created if missing), in one write."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    try:
        _regular(fd, path)
        _write_all(fd, data.encode("utf-8") if isinstance(data, str) else data)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _regular(fd: int, path) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return st


@contextlib.contextmanager
def open_regular(path: str | os.PathLike, follow: bool = False) -> Iterator[tuple[int, os.stat_result]]:
    """(fd, stat) of the regular file ``path``, opened for reading without
    following a symlink (unless ``follow``: a file the user named) and
    without blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | (0 if follow else os.O_NOFOLLOW) | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symlink (not followed)", str(path)) from None
        raise
    try:
        yield fd, _regular(fd, path)
    finally:
        os.close(fd)


def read_bytes(path: str | os.PathLike, limit: int = RECORD_LIMIT, follow: bool = False) -> bytes:
    """The regular file ``path``; larger than ``limit`` bytes is an ``OSError``."""
    with open_regular(path, follow) as (fd, st):
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
        return read_fd(fd, limit)


def read_fd(fd: int, limit: int) -> bytes:
    """What the open file ``fd`` holds from where it stands, at most ``limit`` bytes (a file that grew while it
    was read is cut at ``limit``)."""
    return _read_upto(fd, limit + 1)[:limit]


def _read_upto(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def mtime(path: str | os.PathLike) -> float | None:
    """When a record was last written (its own time, never a symlink's target's); None when it is not there."""
    try:
        return os.stat(path, follow_symlinks=False).st_mtime
    except OSError:
        return None


def read_text(path: str | os.PathLike, limit: int = RECORD_LIMIT) -> str:
    """:func:`read_bytes` decoded as UTF-8, undecodable bytes replaced."""
    return read_bytes(path, limit).decode("utf-8", errors="replace")


def remove_tree(path: str | os.PathLike) -> None:
    """Remove ``path`` and what is below it, as far as it goes (what a failed step had half-written)."""
    import shutil  # (here: a command that removes nothing does not pay for it)

    shutil.rmtree(path, ignore_errors=True)


def toml():
    """Python 3.11's ``tomllib``, or ``tomli`` before it (loaded on first use: most commands read no TOML)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib


def read_toml(path: str | os.PathLike, limit: int = RECORD_LIMIT) -> dict:
    """The TOML file a user named (a symlink is followed; it must end at a regular
    file of at most ``limit`` bytes): ``OSError``, or ``ValueError`` for text that is
    not UTF-8, not TOML, or nested too deep."""
    tomllib = toml()
    text = read_bytes(path, limit, follow=True).decode("utf-8")
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise ValueError("nested too deep") from None


def loads(text: str | bytes) -> object:
    """``json.loads``; nesting too deep for Python is a ``ValueError`` too."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def read_json(path: str | os.PathLike, limit: int = RECORD_LIMIT) -> object:
    """The JSON value in ``path`` (``OSError`` as :func:`read_bytes`; damage is ``ValueError``)."""
    return loads(read_text(path, limit))


def read_record(path: str | os.PathLike, limit: int = RECORD_LIMIT) -> dict:
    """The JSON object in ``path``; ``{}`` when it is missing, unreadable, damaged or not an object."""
    try:
        value = read_json(path, limit)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def tail(path: str | os.PathLike, nbytes: int) -> bytes:
    """The last ``nbytes`` of the regular file ``path`` (all of it when smaller),
    read from the end: a huge log costs ``nbytes`` of memory."""
    with open_regular(path) as (fd, st):
        start = max(st.st_size - nbytes, 0)
        os.lseek(fd, start, os.SEEK_SET)
        return _read_upto(fd, nbytes)


def copy_out(path: str | os.PathLike, write, chunk: int = 1 << 20) -> None:
    """Feed the regular file ``path`` to ``write`` in chunks (a huge log is never held whole)."""
    with open_regular(path) as (fd, _):
        while data := os.read(fd, chunk):
            write(data)


def lines(path: str | os.PathLike, longest: int = 1 << 20) -> Iterator[str | None]:
    """The regular file ``path`` line by line (UTF-8, undecodable bytes replaced),
    streamed; a line longer than ``longest`` bytes is not kept whole: it is
    None (damage), so a file without newlines costs ``longest`` of memory."""
    with open_regular(path) as (fd, _):
        part, skipping = b"", False
        while chunk := os.read(fd, 1 << 20):
            pieces = (part + chunk).split(b"\n")
            part = pieces.pop()
            for piece in pieces:
                if skipping:
                    skipping = False
                    continue
                yield piece.decode("utf-8", errors="replace")
            if len(part) > longest:
                if not skipping:
                    yield None
                part, skipping = b"", True
        if part and not skipping:
            yield part.decode("utf-8", errors="replace")


def keep_by_content(src_fd: int, directory: str | os.PathLike, name, mode: int = 0o444, keep=None) -> str:
    """Copy the open file ``src_fd`` into ``directory`` as ``name(sha256 hex)`` (mode ``mode``),
    kept once: a copy already there under that name stays, unless ``keep(path, hex)`` says it
    does not hold that content (then it is replaced). The sha256."""
    import hashlib
    import tempfile

    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=".new-", dir=directory)  # O_EXCL|O_NOFOLLOW, 0600
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := os.read(src_fd, 4 << 20):
                h.update(chunk)
                out.write(chunk)
        digest = h.hexdigest()
        os.chmod(tmp, mode)
        final = Path(directory) / name(digest)
        try:
            os.link(tmp, final)
        except FileExistsError:
            if keep is not None and not keep(final, digest):
                os.replace(tmp, final)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return digest


def own_directory(path: str | os.PathLike) -> bool:
    """Make ``path`` (0700, parents as needed) and say whether it is a directory of this
    user's own that no one else can write: what it holds may decide what runs."""
    try:
        with owned(path):
            return True
    except NotOwned:
        return False


class NotOwned(OSError):
    """A directory that is not this user's own, or that others can write."""


@contextlib.contextmanager
def owned(path: str | os.PathLike, create: bool = True) -> Iterator[Path]:
    """``path`` opened as a directory of this user's own that no one else can write
    (made 0700, parents as needed, when ``create``), as a ``/proc/self/fd/N`` path to
    the directory that was checked: every name below it resolves inside that
    directory, whatever later replaces ``path`` itself (a store swapped by a user who
    can write its parent). :class:`NotOwned` (an ``OSError``) otherwise."""
    path = Path(path)
    if create:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotOwned(e.errno, "not a directory (a symlink is not followed)", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise NotOwned(errno.EPERM, "not a directory of this user's own that only its owner can write", str(path))
        yield Path(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def sha256_of(fd: int) -> str:
    """The sha256 of what is left to read from the open file ``fd``."""
    import hashlib

    h = hashlib.sha256()
    while chunk := os.read(fd, 4 << 20):
        h.update(chunk)
    return h.hexdigest()


def verify(path: str | os.PathLike, hexdigest: str, memo: "StatMemo | None" = None, key: str | None = None) -> bool:
    """Whether the regular file ``path`` (never through a symlink) holds content whose sha256
    is ``hexdigest``: read and hashed, unless ``memo`` saw this very file (inode, size, times)
    verified before. A file changed in place (written, truncated, chmod) or replaced has a
    new ctime or inode: it is read again. ``key`` names the file in the memo (default: ``path``)."""
    key = key or str(path)
    try:
        with open_regular(path) as (fd, st):
            if memo is not None and memo.get(key, st) == hexdigest:
                return True
            found = sha256_of(fd)
    except OSError:
        return False
    if found != hexdigest:
        return False
    if memo is not None:
        memo.put(key, st, hexdigest)
    return True


class StatMemo:
    """A JSON file mapping a path to a value (a digest) computed from the file's content,
    kept while the file's device, inode, size, mtime and ctime stay the same (as git's
    index). A file changed within ``RACY`` seconds may change again within its time stamp:
    not memoized."""

    RACY = 2.0

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.changed = False
        try:
            data = read_json(self.path)
            self.data = data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            self.data = {}

    @staticmethod
    def _key(st: os.stat_result) -> list:
        return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]

    def get(self, path: str | os.PathLike, st: os.stat_result) -> str | None:
        entry = self.data.get(str(path))
        if (
            not isinstance(entry, list)
            or len(entry) != 6
            or entry[:5] != self._key(st)
            or not isinstance(entry[5], str)
        ):
            return None
        return entry[5]

    def put(self, path: str | os.PathLike, st: os.stat_result, value: str, written: bool = False) -> None:
        """``written``: kit wrote the file itself from the content it hashed (a store's object),
        so it is memoized at once, not only once it is older than ``RACY``."""
        now = time.time()
        if written or (now - st.st_mtime_ns / 1e9 > self.RACY and now - st.st_ctime_ns / 1e9 > self.RACY):
            self.data[str(path)] = [*self._key(st), value]
            self.changed = True

    def keep_only(self, keys) -> None:
        """Forget every entry but ``keys``' (a memo of one use's files stays that use's size)."""
        kept = {k: v for k, v in self.data.items() if k in set(keys)}
        self.changed, self.data = self.changed or kept != self.data, kept

    def save(self) -> None:
        """Written when something was put (a memo that cannot be written is only slower)."""
        if self.changed:
            with contextlib.suppress(OSError):
                write_atomic(self.path, json.dumps(self.data, separators=(",", ":")), 0o600)
