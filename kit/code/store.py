"""A code snapshot as jobs use it: the store trusted only as its owner's, a snapshot's
manifest checked, and its view laid out in a job directory (see :mod:`kit.code.snapshot`, which
takes snapshots into the store)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from kit import files
from kit.errors import KitError

SKIPPED = frozenset({".git", "__pycache__"})  # never linked into a view: the live repository, stale bytecode
_CHUNK = 1 << 20
HEX = frozenset("0123456789abcdef")  # an object's name: a sha256 in lower-case hex


@dataclass(frozen=True)
class Snapshot:
    """One snapshot: its digest, where it was taken from, and what git said of it."""

    digest: str  # sha256:<hex> of its manifest (paths, modes, contents)
    root: str  # the directory snapshotted (the work tree's top, or --code DIR)
    store: str  # the store holding its contents and manifest
    source: str  # "git" or "directory"
    files: int
    bytes: int
    commit: str | None = None  # git HEAD (None: not a git tree, or no commit yet)
    dirty: bool | None = None  # uncommitted changes or untracked files in the snapshot

    def record(self) -> dict:
        """What ``job.json`` keeps (``snapshot``)."""
        return asdict(self)


@contextlib.contextmanager
def opened(store: Path, *, create: bool, field: str = "--code"):
    """The store and its ``objects/`` and ``manifests/``, each checked as this user's own and
    opened (see :func:`kit.files.owned`): (store, objects, manifests) as paths through the
    descriptors."""
    d = Path(store)
    try:
        with contextlib.ExitStack() as stack:
            top = stack.enter_context(files.owned(d, create))
            d = d / "objects"
            objects = stack.enter_context(files.owned(top / "objects", create))
            d = d.parent / "manifests"
            manifests = stack.enter_context(files.owned(top / "manifests", create))
            stack.enter_context(locked(top, exclusive=False))
            yield top, objects, manifests
    except files.NotOwned:
        raise KitError(
            f"{d} is not a directory of this user's own that only its owner can write: its contents "
            "would decide what jobs run",
            field=field,
            hint="remove it, or give another --output-dir (or KIT_HOME)",
        ) from None
    except FileNotFoundError:
        if create:
            raise
        raise KitError(
            f"the code store {d} is gone", field=field, hint="--edit code_snapshot=false runs the code as it is now"
        ) from None


@contextlib.contextmanager
def locked(top: Path, exclusive: bool):
    """The store ``top`` (a checked, opened directory) locked: shared while a launch stores a snapshot or
    lays one out (its objects are in use before its manifest names them), exclusive while `kit trim`
    decides what no manifest names and removes it (it removed an object a launch was reusing)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


# ---------------------------------------------------------------- using
def load(record: dict) -> Snapshot:
    """A snapshot from its ``job.json`` record (``kit rerun``): its store this user's own, its
    manifest there, holding what its name says."""
    try:
        snap = Snapshot(**record)
    except TypeError:
        raise KitError("the job's snapshot record is damaged", field="JOB") from None
    entries(snap)
    return snap


def _hexdigest(snap: Snapshot) -> str:
    hexdigest = snap.digest.partition(":")[2] if isinstance(snap.digest, str) else ""
    if len(hexdigest) != 64 or not HEX.issuperset(hexdigest):
        raise KitError(f"not a snapshot digest: {snap.digest!r}", field="JOB")
    return hexdigest


def entries(snap: Snapshot, manifests: Path | None = None) -> list[tuple[str, str, str]]:
    """The snapshot's manifest, checked: it hashes to the snapshot's digest, and every entry is
    a path inside the view (relative, no ``..``, none below another entry)."""
    hexdigest = _hexdigest(snap)
    if manifests is None:
        with opened(Path(snap.store), create=False, field="JOB") as (_, _, manifests):
            return entries(snap, manifests)
    path = manifests / (hexdigest + ".json")
    try:
        data = files.read_bytes(path, 1 << 30)
    except FileNotFoundError:
        raise KitError(
            f"the job's code snapshot {snap.digest} is no longer in {snap.store}",
            field="JOB",
            hint="--edit code_snapshot=false runs the code as it is now",
        ) from None
    except OSError as e:
        raise KitError(f"cannot read the job's code snapshot {snap.digest}: {e.strerror}", field="JOB") from None
    if hashlib.sha256(data).hexdigest() != hexdigest:
        raise KitError(
            f"the code snapshot {snap.digest} in {snap.store} does not hold what its name says (changed or replaced)",
            field="JOB",
            hint="--edit code_snapshot=false runs the code as it is now",
        )
    try:
        return _checked_entries(files.loads(data.decode("utf-8", "surrogateescape")))
    except ValueError as e:
        raise KitError(f"the code snapshot {snap.digest} is damaged: {e}", field="JOB") from None


def _checked_entries(manifest) -> list[tuple[str, str, str]]:
    if not isinstance(manifest, list):
        raise ValueError("not a list")
    out, seen = [], set()
    for entry in manifest:
        if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(v, str) for v in entry)):
            raise ValueError(f"not an entry: {str(entry)[:80]}")
        rel, kind, value = entry
        parts = rel.split("/")
        if (
            not rel
            or "\0" in rel
            or rel.startswith("/")
            or any(p in ("", ".", "..") for p in parts)
            or any(p in SKIPPED for p in parts)
        ):
            raise ValueError(f"a path outside the view: {rel!r}")
        if kind in ("f", "x") and (len(value) != 64 or not HEX.issuperset(value)):
            raise ValueError(f"not an object name: {value!r}")
        if kind not in ("f", "x", "l", "d") or rel in seen:
            raise ValueError(f"a bad or repeated entry: {rel!r}")
        seen.add(rel)
        out.append((rel, kind, value))
    for rel, _, _ in out:
        slash = rel.find("/")
        while slash != -1:
            if rel[:slash] in seen:
                raise ValueError(f"an entry below a file or link: {rel!r}")
            slash = rel.find("/", slash + 1)
    return out


def workdir(snap: Snapshot, view: Path, cwd: Path) -> Path:
    """Where in ``view`` a command started in ``cwd`` runs."""
    cwd, root = Path(cwd).resolve(), Path(snap.root)
    return view / cwd.relative_to(root) if inside(cwd, root) else view


def live_directories(snap: Snapshot, cwd: Path) -> list[str]:
    """The directories beside the command's start (``cwd``) that the snapshot leaves out
    (ignored: data, outputs; hidden ones and packaging metadata left unsaid): the job reaches
    them live, so what it writes there lands in the work tree; a relative path that does not
    exist at submission is created in the view."""
    cwd, root = Path(cwd).resolve(), Path(snap.root)
    if not inside(cwd, root):
        return []
    here = cwd.relative_to(root)
    taken = {
        Path(rel).relative_to(here).parts[0]
        for rel, _, _ in entries(snap)
        if here == Path(".") or Path(rel).is_relative_to(here)
    }
    try:
        names = sorted(os.listdir(cwd))
    except OSError:
        return []
    return [
        n
        for n in names
        if n not in taken
        and n not in SKIPPED
        and not n.startswith(".")
        and not n.endswith(".egg-info")
        and (cwd / n).is_dir()
    ]


class Damaged(KitError):
    """An object of the store whose content is not its name."""


def materialize(snap: Snapshot, view: Path, listing: Path) -> None:
    """Lay ``snap`` out at ``view`` (see the module's text), and record in ``listing`` (NUL-separated
    triples: ``f``/``x`` and the object's path, or ``l`` and the link's target; then the path in
    the view) what prelaunch puts back when a run changed it."""
    with opened(Path(snap.store), create=False, field="JOB") as (_, objects, manifests):
        manifest = entries(snap, manifests)
        real_objects, root = Path(snap.store) / "objects", Path(snap.root)
        view.mkdir(mode=0o755)
        dirs = {Path(".")}
        record: list[str] = []
        for rel, kind, value in manifest:
            dest = view / rel
            for parent in reversed(Path(rel).parents):
                if parent not in dirs:
                    (view / parent).mkdir()
                    dirs.add(parent)
            if kind in ("l", "d"):
                target = value if kind == "l" else str(root / rel)
                os.symlink(target, dest)
                record += ["l", target, rel]
            else:
                name = value + (".x" if kind == "x" else "")
                _copy_verified(objects / name, dest, value, 0o555 if kind == "x" else 0o444)
                record += [kind, str(real_objects / name), rel]
    for d in sorted(dirs):  # what the snapshot leaves out stays reachable where it was
        try:
            names = os.listdir(root / d) if not os.path.islink(root / d) else []
        except OSError:
            continue
        for name in sorted(names):
            if name not in SKIPPED and not os.path.lexists(view / d / name):
                os.symlink(root / d / name, view / d / name)  # not the snapshot's: never put back
    files.create(listing, b"".join(os.fsencode(v) + b"\0" for v in record), 0o600)


def _copy_verified(obj: Path, dest: Path, hexdigest: str, mode: int) -> None:
    """Copy the object ``obj`` (never through a symlink) to the new file ``dest``, checking its
    content against its name as it goes; :class:`Damaged` (nothing left at ``dest``) if not."""
    h = hashlib.sha256()
    try:
        with files.open_regular(obj) as (fd, _):
            with os.fdopen(
                os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "wb"
            ) as w:
                while chunk := os.read(fd, _CHUNK):
                    h.update(chunk)
                    w.write(chunk)
                os.fchmod(w.fileno(), mode)
    except FileNotFoundError as e:
        if e.filename and str(e.filename) == str(dest):
            raise
        raise Damaged(
            f"the code store lost the object {hexdigest[:12]}",
            field="JOB",
            hint="--edit code_snapshot=false runs the code as it is now",
        ) from None
    if h.hexdigest() != hexdigest:
        os.unlink(dest)
        raise Damaged(
            f"the code store's object {hexdigest[:12]} does not hold what its name says (changed or replaced)",
            field="JOB",
            hint="--edit code_snapshot=false runs the code as it is now",
        )
