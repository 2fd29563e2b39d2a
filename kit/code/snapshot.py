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
snapshotted file a copy of its object, checked against its name as it is copied
(a job that writes into its code changes its own copy, never the store nor another
job), every directory a real one, and every other entry of the work tree's
directories (ignored files, data directories, ``outputs/``) a symlink to where it
lives, so that paths relative to the submission directory reach what they reached
before. ``code.list`` records what the view holds; at each run's start prelaunch puts
back from the store whatever a run changed (``kit::restore_code``), so every run of
the job, requeues included, runs the submitted content.

The store is trusted only as its owner's: it, ``objects/`` and ``manifests/`` must be
directories of this user's own that no one else can write (opened once and used
through that descriptor, so a store swapped in a shared output directory is never
read), a manifest must hash to its name and its paths stay inside the view, and an
object must hash to its name before it is copied.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import subprocess
from pathlib import Path

from kit import files
from kit.code import store as codestore
from kit.code.store import SKIPPED, Damaged, Snapshot, live_directories, load, materialize, workdir
from kit.errors import KitError
from kit.home import kit_home

__all__ = [
    "Damaged",
    "Snapshot",
    "live_directories",
    "load",
    "materialize",
    "workdir",
    "take",
    "store_for",
    "limit",
    "mib",
]

LIMIT = 512 << 20  # bytes a snapshot may hold: code, not data (KIT_CODE_LIMIT overrides)
MAX_FILES = 200_000


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


def limit() -> int:
    value = os.environ.get("KIT_CODE_LIMIT", "")
    return int(value) if value.isdigit() else LIMIT


# ---------------------------------------------------------------- taking
def require_workdir(snapshotted: bool, workdir: Path, label: str) -> None:
    """Without a snapshot a job runs its code where it was launched: that directory must still be there
    (a rerun with ``--edit code_snapshot=false`` of a job whose directory is gone would submit a job
    that fails at once, 127)."""
    if not snapshotted and not workdir.is_dir():
        raise KitError(
            f"the job would run its code in {workdir}, which is gone",
            field=label,
            hint="launch it anew from where its code is now (kit launch … from that directory)",
        )


def take(
    cwd: Path, code_dir: str | None = None, *, store: Path, label: str = "--code", exclude: tuple[Path, ...] = ()
) -> Snapshot | None:
    """Snapshot ``code_dir`` (given: any directory containing ``cwd``), else ``cwd``'s git work
    tree, into ``store`` (:func:`store_for`), leaving out what lies under ``exclude`` (the jobs'
    output directory, the store: a job never snapshots earlier jobs); None when ``cwd`` is in
    none (the job then runs its files as they are at each start)."""
    cwd = Path(cwd).resolve()
    if code_dir is not None:
        root = Path(code_dir).expanduser()
        root = (cwd / root if not root.is_absolute() else root).resolve()
        if not root.is_dir():
            raise KitError(
                f"no such directory: {code_dir}",
                field=label,
                hint="give the directory whose files the job runs (e.g. --code .)",
            )
        if not codestore.inside(cwd, root):
            raise KitError(
                f"the job runs from {cwd}, which is outside {root}",
                field=label,
                hint="launch from inside the directory you snapshot, or --code a directory containing it",
            )
    else:
        root = _git_top(cwd)
        if root is None:
            return None
    top = _git_top(root, refused_ok=True) if code_dir is not None else root
    skip = [
        str(Path(p).resolve().relative_to(root))
        for p in (*exclude, store)
        if codestore.inside(Path(p).resolve(), root) and Path(p).resolve() != root
    ]
    if top is not None:
        names, (commit, dirty) = _git_files_and_state(root, skip)
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
        raise KitError(
            f"cannot keep the code snapshot in {store}: {e.strerror}",
            field=label,
            exit_code=1,
            hint="free space there (or set KIT_HOME), or --no-code-snapshot",
        ) from None


def _keep(store: Path, root: Path, entries, label: str, source: str, commit, dirty) -> Snapshot:
    """The entries' contents into the store, and the manifest naming them."""
    with codestore.opened(store, create=True, field=label) as (top, objects, manifests):
        memo = files.StatMemo(top / "stat-memo.json")
        total = 0
        manifest = []
        for rel, st, target in entries:
            if target is not None:
                manifest.append([rel, "l", target])
            elif st is None:
                manifest.append([rel, "d", ""])  # a submodule: linked, live
            else:
                try:
                    digest = _stored(root / rel, objects, st, memo)
                except OSError as e:
                    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) or (
                        e.filename and str(e.filename).startswith(("/proc/self/fd/", str(store)))
                    ):
                        raise  # the store's problem, not the file's
                    if e.errno == errno.ENOENT:
                        continue  # deleted since it was listed (a build's temporary tree): not part of it
                    raise KitError(
                        f"cannot snapshot {root / rel}: {e.strerror}",
                        field=label,
                        exit_code=1,
                        hint="make it readable, ignore it in .gitignore, or --no-code-snapshot",
                    ) from None
                executable = bool(st.st_mode & 0o111)
                manifest.append([rel, "x" if executable else "f", digest])
                total += st.st_size
        memo.save()
        text = json.dumps(manifest, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogateescape")
        digest = "sha256:" + hashlib.sha256(text).hexdigest()
        path = manifests / (digest.split(":")[1] + ".json")
        if not files.verify(path, digest.split(":")[1]):
            files.write_atomic(path, text, 0o600)
    return Snapshot(digest, str(root), str(store), source, len(manifest), total, commit, dirty)


def _stored(path: Path, objects: Path, st: os.stat_result, memo: files.StatMemo) -> str:
    """The sha256 of ``path``, its content in the store: known from the memo when the file
    is unchanged and its object still holds that content, else read and kept (an object
    whose content is not its name is replaced)."""
    known = memo.get(path, st)
    if known:
        name = _object_name(known, st)
        if files.verify(objects / name, known, memo, key=f"objects/{name}"):
            return known
    with files.open_regular(path) as (fd, _):
        digest = files.keep_by_content(
            fd,
            objects,
            lambda d: _object_name(d, st),
            0o555 if st.st_mode & 0o111 else 0o444,
            keep=lambda obj, d: files.verify(obj, d),
        )
    memo.put(path, st, digest)
    name = _object_name(digest, st)
    with files.open_regular(objects / name) as (_, written):
        memo.put(f"objects/{name}", written, digest, written=True)
    return digest


def _git(args: list[str], cwd: Path, wait: bool = True):
    """git in ``cwd``, reading only: no optional locks, so ``git status`` never rewrites the
    tree's index (as root in a teammate's tree it would leave an index they cannot write);
    finished, or (``wait=False``) started with its output piped."""
    argv, env = ["git", "-C", str(cwd), *args], {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    if not wait:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    return subprocess.run(argv, capture_output=True, timeout=120, env=env)


def _git_top(path: Path, refused_ok: bool = False) -> Path | None:
    """The top of the git work tree holding ``path``; None outside one. A tree git refuses (owned
    by another user: "dubious ownership") is an error, never silently not snapshotted — unless
    ``refused_ok`` (``--code DIR``: then it is snapshotted as a plain directory)."""
    try:
        proc = _git(["rev-parse", "--show-toplevel"], path)
    except OSError:
        return None  # no git: no work tree to snapshot
    except subprocess.TimeoutExpired:
        raise _silent(path) from None  # never silently the live files
    if proc.returncode != 0:
        if b"dubious ownership" in proc.stderr and not refused_ok:
            where = re.search(rb"repository at '([^']*)'", proc.stderr)
            tree = os.fsdecode(where.group(1)) if where else str(path)
            raise KitError(
                f'git refuses the work tree {tree}: another user owns it (git\'s "dubious ownership"), '
                "so the job's code cannot be snapshotted from it",
                field="--code",
                hint=f"snapshot it as a plain directory (--code {tree}), trust its owner "
                f"(git config --global --add safe.directory {tree}), or --no-code-snapshot",
            )
        return None
    return Path(os.fsdecode(proc.stdout.rstrip(b"\n"))).resolve()


def _silent(where: Path) -> KitError:
    return KitError(
        f"git did not answer within 120 s in {where}", field="--code", hint="--no-code-snapshot runs without it"
    )


def _git_files_and_state(root: Path, skip: list[str]) -> tuple[list[str], tuple[str | None, bool | None]]:
    """The files under ``root`` (relative to it) git tracks or does not ignore; and (HEAD, whether the tree
    differs from it, what ``skip`` names left out; None where git could not tell), git asked both at once."""
    status = ["status", "--porcelain=v2", "-z", "--branch", "--untracked-files=normal", "--", "."]
    state = _git([*status, *(f":(exclude){d}" for d in skip)], root, wait=False)
    try:
        listed = _git(["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."], root)
        said, _ = state.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        raise _silent(root) from None
    finally:
        state.kill()
        state.wait()
    if listed.returncode != 0:
        raise KitError(
            f"git ls-files failed in {root}: {listed.stderr.decode(errors='replace').strip()}",
            field="--code",
            hint="fix the repository, or --no-code-snapshot",
        )
    names = sorted({os.fsdecode(n) for n in listed.stdout.split(b"\0") if n})
    if state.returncode != 0:
        return names, (None, None)
    records = [r for r in said.split(b"\0") if r]
    head = next((r[len(b"# branch.oid ") :] for r in records if r.startswith(b"# branch.oid ")), b"")
    commit = head.decode() if head and head != b"(initial)" else None
    return names, (commit, any(not r.startswith(b"# ") for r in records))


def _walk(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):  # symlinked directories are not followed
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED and not os.path.islink(os.path.join(dirpath, d)))
        rel = os.path.relpath(dirpath, root)
        out.extend(os.path.normpath(os.path.join(rel, n)) for n in filenames)
        out.extend(
            os.path.normpath(os.path.join(rel, d))
            for d in os.listdir(dirpath)
            if os.path.islink(os.path.join(dirpath, d)) and d not in filenames
        )
        if len(out) > MAX_FILES:
            break
    return sorted(out)


def _entries(root: Path, names: list[str], label: str) -> list[tuple[str, os.stat_result | None, str | None]]:
    """(path, stat of a regular file | None, symlink target | None) for what is on disk now;
    too many or too large is refused with the largest files named."""
    if len(names) > MAX_FILES:
        raise KitError(
            f"{root} has more than {MAX_FILES} files to snapshot",
            field=label,
            hint="ignore data in .gitignore, --code a smaller directory, or --no-code-snapshot",
        )
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
        named = ", ".join(f"{rel} ({mib(size)})" for size, rel in largest)
        raise KitError(
            f"the code snapshot of {root} would hold {mib(total)}, over its limit of {mib(limit())}; "
            f"the largest files: {named}",
            field=label,
            hint="add data files to .gitignore, --code a smaller directory, or --no-code-snapshot "
            "(KIT_CODE_LIMIT=BYTES raises the limit)",
        )
    return out


def mib(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _object_name(digest: str, st: os.stat_result) -> str:
    """An object's name: its sha256, ``.x`` for an executable's (the mode travels with it)."""
    return digest + (".x" if st.st_mode & 0o111 else "")
