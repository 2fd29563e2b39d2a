"""A job's code as it was submitted (in the manner of NeMo-Run's ``GitArchivePackager``).

At submission :func:`take` records the user's files: by default the git work tree
the command runs from (tracked files and untracked ones git does not ignore, as
they are on disk: uncommitted changes included, ignored files never), or every
file under ``--code DIR``. Their contents go to a content-addressed store
(``objects/<sha256>``, read-only), shared by every job: a file already there is never
copied again, and a file whose inode, size and times are unchanged since the last
snapshot is not even read again (a stat memo, as git's index). The store is
``$KIT_HOME/code`` when it is on the job directories' file system, else
``<output-dir>/.kit-code-<uid>`` (a view links into its store: across file systems it
would have to copy). The snapshot's digest names its list of (path, mode, content).

:func:`materialize` lays the snapshot out in the job directory (``code/``): every
snapshotted file a hard link to its object (a copy across file systems), every
directory a real one, and every other entry of the work tree's directories
(ignored files, data directories, ``outputs/``) a symlink to where it lives, so
that paths relative to the submission directory reach what they reached before.
Every run of the job, requeues included, runs in that view.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from kit import files
from kit.errors import KitError
from kit.home import kit_home

LIMIT = 512 << 20  # bytes a snapshot may hold: code, not data (KIT_CODE_LIMIT overrides)
MAX_FILES = 200_000
SKIPPED = frozenset({".git", "__pycache__"})  # never linked into a view: the live repository, stale bytecode
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Snapshot:
    """One snapshot: its digest, where it was taken from, and what git said of it."""

    digest: str              # sha256:<hex> of its manifest (paths, modes, contents)
    root: str                # the directory snapshotted (the work tree's top, or --code DIR)
    store: str               # the store holding its contents and manifest
    source: str              # "git" or "directory"
    files: int
    bytes: int
    commit: str | None = None  # git HEAD (None: not a git tree, or no commit yet)
    dirty: bool | None = None  # uncommitted changes or untracked files in the snapshot

    def record(self) -> dict:
        """What ``job.json`` keeps (``snapshot``)."""
        return asdict(self)


def store_for(output_dir: Path) -> Path:
    """The store for jobs written under ``output_dir``: ``$KIT_HOME/code`` on the same file
    system, else one beside the jobs."""
    home = kit_home() / "code"
    near = Path(output_dir) / f".kit-code-{os.geteuid()}"
    try:
        out = Path(output_dir)
        while not out.exists():
            out = out.parent
        here = home if home.exists() else home.parent
        while not here.exists():
            here = here.parent
        return home if os.stat(here).st_dev == os.stat(out).st_dev else near
    except OSError:
        return home


def _store_dir(store: Path, *parts: str) -> Path:
    """A directory of the store, this user's own (created 0700; another's is refused)."""
    path = store.joinpath(*parts)
    for d in (store, path):
        if not files.own_directory(d):
            raise KitError(f"{d} is not a directory of this user's own: its contents would decide what jobs run",
                           field="--code", hint="remove it, or give another --output-dir (or KIT_HOME)")
    return path


def limit() -> int:
    value = os.environ.get("KIT_CODE_LIMIT", "")
    return int(value) if value.isdigit() else LIMIT


# ---------------------------------------------------------------- taking
def take(cwd: Path, code_dir: str | None = None, *, store: Path, label: str = "--code",
         exclude: tuple[Path, ...] = ()) -> Snapshot | None:
    """Snapshot ``code_dir`` (given: any directory containing ``cwd``), else ``cwd``'s git work
    tree, into ``store`` (:func:`store_for`), leaving out what lies under ``exclude`` (the jobs'
    output directory, the store: a job never snapshots earlier jobs); None when ``cwd`` is in
    none (the job then runs its files as they are at each start)."""
    cwd = Path(cwd).resolve()
    if code_dir is not None:
        root = Path(code_dir).expanduser()
        root = (cwd / root if not root.is_absolute() else root).resolve()
        if not root.is_dir():
            raise KitError(f"no such directory: {code_dir}", field=label,
                           hint="give the directory whose files the job runs (e.g. --code .)")
        if not _inside(cwd, root):
            raise KitError(f"the job runs from {cwd}, which is outside {root}", field=label,
                           hint="launch from inside the directory you snapshot, or --code a directory containing it")
    else:
        root = _git_top(cwd)
        if root is None:
            return None
    skip = [str(Path(p).resolve().relative_to(root)) for p in (*exclude, store)
            if _inside(Path(p).resolve(), root) and Path(p).resolve() != root]
    top = _git_top(root)
    if top is not None:
        names = _git_files(root)
        commit, dirty = _git_state(root, skip)
        source = "git"
    else:
        names = _walk(root)
        commit = dirty = None
        source = "directory"
    names = [n for n in names if not any(n == d or n.startswith(d + "/") for d in skip)]
    entries = _entries(root, names, label)
    try:
        return _keep(store, root, entries, label, source, commit, dirty)
    except OSError as e:  # the store's disk full or unwritable
        raise KitError(f"cannot keep the code snapshot in {store}: {e.strerror}", field=label, exit_code=1,
                       hint="free space there (or set KIT_HOME), or --no-code-snapshot") from None


def _keep(store: Path, root: Path, entries, label: str, source: str, commit, dirty) -> Snapshot:
    """The entries' contents into the store, and the manifest naming them."""
    objects = _store_dir(store, "objects")
    memo = files.StatMemo(store / "stat-memo.json")
    total = 0
    manifest = []
    for rel, st, target in entries:
        if target is not None:
            manifest.append([rel, "l", target])
        elif st is None:
            manifest.append([rel, "d", ""])  # a submodule: linked, live
        else:
            try:
                known = memo.get(root / rel, st)
                if known and not (objects / _object_name(known, st)).exists():
                    known = None  # the store lost it
                digest = known or _store_file(root / rel, objects, st, memo)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) or (
                        e.filename and Path(e.filename).is_relative_to(store)):
                    raise  # the store's problem, not the file's
                raise KitError(f"cannot snapshot {root / rel}: {e.strerror}", field=label, exit_code=1,
                               hint="make it readable, ignore it in .gitignore, or --no-code-snapshot") from None
            executable = bool(st.st_mode & 0o111)
            manifest.append([rel, "x" if executable else "f", digest])
            total += st.st_size
    memo.save()
    text = json.dumps(manifest, separators=(",", ":"), ensure_ascii=False)
    digest = "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
    manifests = _store_dir(store, "manifests")
    path = manifests / (digest.split(":")[1] + ".json")
    if not path.exists():
        files.write_atomic(path, text.encode("utf-8", "surrogateescape"), 0o600)
    return Snapshot(digest, str(root), str(store), source, len(manifest), total, commit, dirty)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, timeout=120)


def _git_top(path: Path) -> Path | None:
    try:
        proc = _git(["rev-parse", "--show-toplevel"], path)
    except (OSError, subprocess.TimeoutExpired):
        return None  # no git: no work tree to snapshot
    if proc.returncode != 0:
        return None
    return Path(os.fsdecode(proc.stdout.rstrip(b"\n"))).resolve()


def _git_files(root: Path) -> list[str]:
    """Tracked files and untracked ones git does not ignore, under ``root`` (relative to it)."""
    proc = _git(["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."], root)
    if proc.returncode != 0:
        raise KitError(f"git ls-files failed in {root}: {proc.stderr.decode(errors='replace').strip()}",
                       field="--code", hint="fix the repository, or --no-code-snapshot")
    return sorted({os.fsdecode(n) for n in proc.stdout.split(b"\0") if n})


def _git_state(root: Path, skip: list[str]) -> tuple[str | None, bool]:
    """(HEAD, whether the tree differs from it), what ``skip`` names left out."""
    head = _git(["rev-parse", "--verify", "-q", "HEAD"], root)
    commit = head.stdout.decode().strip() or None if head.returncode == 0 else None
    status = _git(["status", "--porcelain", "-z", "--untracked-files=normal", "--", ".",
                   *(f":(exclude){d}" for d in skip)], root)
    return commit, bool(status.stdout.strip(b"\0"))


def _walk(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):  # symlinked directories are not followed
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED and not os.path.islink(os.path.join(dirpath, d)))
        rel = os.path.relpath(dirpath, root)
        out.extend(os.path.normpath(os.path.join(rel, n)) for n in filenames)
        out.extend(os.path.normpath(os.path.join(rel, d)) for d in os.listdir(dirpath)
                   if os.path.islink(os.path.join(dirpath, d)) and d not in filenames)
        if len(out) > MAX_FILES:
            break
    return sorted(out)


def _entries(root: Path, names: list[str], label: str) -> list[tuple[str, os.stat_result | None, str | None]]:
    """(path, stat of a regular file | None, symlink target | None) for what is on disk now;
    too many or too large is refused with the largest files named."""
    if len(names) > MAX_FILES:
        raise KitError(f"{root} has more than {MAX_FILES} files to snapshot", field=label,
                       hint="ignore data in .gitignore, --code a smaller directory, or --no-code-snapshot")
    out = []
    for rel in names:
        if any(part in SKIPPED for part in Path(rel).parts):
            continue
        try:
            st = os.lstat(root / rel)
        except OSError:
            continue  # deleted in the work tree (still in git's index): not part of it
        if stat.S_ISLNK(st.st_mode):
            out.append((rel, None, os.readlink(root / rel)))
        elif stat.S_ISREG(st.st_mode):
            out.append((rel, st, None))
        elif stat.S_ISDIR(st.st_mode):
            out.append((rel, None, None))
    total = sum(st.st_size for _, st, _ in out if st is not None)
    if total > limit():
        largest = sorted(((st.st_size, rel) for rel, st, _ in out if st is not None), reverse=True)[:5]
        named = ", ".join(f"{rel} ({_mib(size)})" for size, rel in largest)
        raise KitError(f"the code snapshot of {root} would hold {_mib(total)}, over its limit of {_mib(limit())}; "
                       f"the largest files: {named}", field=label,
                       hint="add data files to .gitignore, --code a smaller directory, or --no-code-snapshot "
                            "(KIT_CODE_LIMIT=BYTES raises the limit)")
    return out


def _mib(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _object_name(digest: str, st: os.stat_result) -> str:
    """An object's name: its sha256, ``.x`` for an executable's (the mode travels with it)."""
    return digest + (".x" if st.st_mode & 0o111 else "")


def _store_file(path: Path, objects: Path, st: os.stat_result, memo: files.StatMemo) -> str:
    """Hash ``path`` into the store (written once per content); its sha256."""
    with files.open_regular(path) as (fd, _):
        digest = files.keep_by_content(fd, objects, lambda d: _object_name(d, st),
                                       0o555 if st.st_mode & 0o111 else 0o444)
    memo.put(path, st, digest)
    return digest


# ---------------------------------------------------------------- using
def load(record: dict) -> Snapshot:
    """A snapshot from its ``job.json`` record (``kit rerun``), its manifest still in the store."""
    try:
        snap = Snapshot(**record)
    except TypeError:
        raise KitError("the job's snapshot record is damaged", field="JOB") from None
    if not _manifest_path(snap).is_file():
        raise KitError(f"the job's code snapshot {snap.digest} is no longer in {snap.store}", field="JOB",
                       hint="--edit code_snapshot=false runs the code as it is now")
    return snap


def _manifest_path(snap: Snapshot) -> Path:
    hexdigest = snap.digest.partition(":")[2]
    if not hexdigest or not all(c in "0123456789abcdef" for c in hexdigest):
        raise KitError(f"not a snapshot digest: {snap.digest!r}", field="JOB")
    return Path(snap.store) / "manifests" / (hexdigest + ".json")


def workdir(snap: Snapshot, view: Path, cwd: Path) -> Path:
    """Where in ``view`` a command started in ``cwd`` runs."""
    cwd, root = Path(cwd).resolve(), Path(snap.root)
    return view / cwd.relative_to(root) if _inside(cwd, root) else view


def materialize(snap: Snapshot, view: Path) -> None:
    """Lay ``snap`` out at ``view`` (see the module's text)."""
    manifest = json.loads(files.read_bytes(_manifest_path(snap), 1 << 30).decode("utf-8", "surrogateescape"))
    objects, root = Path(snap.store) / "objects", Path(snap.root)
    view.mkdir(mode=0o755)
    dirs = {Path(".")}
    for rel, kind, value in manifest:
        dest = view / rel
        for parent in reversed(Path(rel).parents):
            if parent not in dirs:
                (view / parent).mkdir(exist_ok=True)
                dirs.add(parent)
        if kind == "l":
            os.symlink(value, dest)
        elif kind == "d":
            os.symlink(root / rel, dest)
        else:
            _link(objects / (value + (".x" if kind == "x" else "")), dest)
    for d in dirs:  # what the snapshot leaves out stays reachable where it was
        try:
            names = os.listdir(root / d) if not os.path.islink(root / d) else []
        except OSError:
            continue
        for name in names:
            if name not in SKIPPED and not os.path.lexists(view / d / name):
                os.symlink(root / d / name, view / d / name)


def _link(obj: Path, dest: Path) -> None:
    try:
        os.link(obj, dest)
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM):
            raise
        with open(obj, "rb") as r, os.fdopen(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                                     | os.O_CLOEXEC, 0o444), "wb") as w:
            while chunk := r.read(_CHUNK):
                w.write(chunk)
        os.chmod(dest, os.stat(obj).st_mode & 0o777)
