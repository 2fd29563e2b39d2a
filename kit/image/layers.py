"""The per-instruction build cache: every step's result kept as an overlay layer.

A layer is the overlayfs upper directory a step wrote (whiteouts for what it
removed included) plus the image configuration after it, stored under
``$KIT_HOME/cache/layers/<key>``. A step's key hashes its parent's key, the
step itself and the fingerprint of what it copies, so a changed line rebuilds
from that line on and an unchanged one is found, not run. The bottom layer is
the base (a rootfs base directory is used in place). A layer appears whole or
not at all (it is written under a temporary name, then renamed), and a
published layer is never changed: a build that made the same layer as another
keeps the one already there.

Builds and ``--prune`` share the cache safely. Each build holds a
:class:`Claim`: a file under ``cache/.claims`` that it keeps locked (``flock``)
while it runs and where it names every entry it uses (layers, temporary
layers, cached images). ``--prune`` takes the cache lock exclusively, removes
only what no running build names, and removes what dead builds left (their
claims, ``.new-*`` layers, partial images); claiming happens under the same
lock, shared, so nothing is claimed while a prune decides.

``kit build --prune`` keeps the cache under a size (least recently used
layers and images go first).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from kit import files
from kit.errors import KitError
from kit.home import kit_home
from kit.image import unpack
from kit.runner import run


def root_dir() -> Path:
    return cache_root() / "layers"


def key(parent: str, step: object, extra: str = "") -> str:
    text = json.dumps([parent, step, extra], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]  # short: many fit in overlay's option string


def cache_root() -> Path:
    return kit_home() / "cache"


@contextlib.contextmanager
def cache_lock(exclusive: bool = False):
    """The cache's lock: shared while a build claims or publishes, exclusive while --prune removes."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


class Claim:
    """What one running build uses in the cache (see the module's docstring)."""

    def __init__(self) -> None:
        folder = cache_root() / ".claims"
        folder.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            path = folder / f"{os.getpid()}-{os.urandom(6).hex()}"
            try:
                self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                break
            except FileExistsError:
                continue
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        self.path = path
        self.private: list[Path] = []  # layers rebuilt while the published ones were in use elsewhere
        self.names: set[str] = set()

    def add(self, name: str) -> None:
        """Name an entry (relative to the cache) this build uses; call under :func:`cache_lock`."""
        if name not in self.names:
            os.write(self.fd, (name + "\n").encode())
            self.names.add(name)

    def close(self) -> None:
        for tmp in self.private:
            remove(tmp)
        if self.fd >= 0:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _live_claims() -> set[str]:
    """Entries named by running builds; a dead build's claim file goes (call under the exclusive lock)."""
    names: set[str] = set()
    folder = cache_root() / ".claims"
    for path in folder.iterdir() if folder.is_dir() else []:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # held: its build runs
                with os.fdopen(os.dup(fd), "rb") as f:
                    names.update(line.decode(errors="replace").strip() for line in f.read(1 << 24).splitlines())
                continue
            path.unlink(missing_ok=True)  # its build is gone
        finally:
            os.close(fd)
    return names


def lookup(layer_key: str, claim: Claim) -> unpack.ImageConfig | None:
    """The configuration after a cached layer (now claimed), or None when it is not cached."""
    with cache_lock():
        meta = root_dir() / layer_key / "config.json"
        if not meta.is_file():
            return None
        claim.add(f"layers/{layer_key}")
        os.utime(root_dir() / layer_key)  # recently used: --prune keeps it longest
        return unpack.ImageConfig(**json.loads(meta.read_text()))


def diff(layer_key: str) -> Path:
    return root_dir() / layer_key / "diff"


def mount(lowers: list[Path], upper: Path, work: Path, target: Path) -> None:
    """An overlay of ``lowers`` (the first is the top) with ``upper`` at ``target``."""
    for p in lowers:
        if "," in str(p) or ":" in str(p):
            raise KitError(f"cannot stack {p} in an overlay (a comma or colon in the path)")
    opts = f"lowerdir={':'.join(map(str, lowers))},upperdir={upper},workdir={work}"
    if len(opts) > 3800:
        raise KitError(f"too many layers to stack ({len(lowers)})", hint="merge RUN lines of the Dockerfile")
    run(["mount", "-t", "overlay", "overlay", "-o", opts, str(target)], what="build")


def usable() -> bool:
    """Whether an overlay with its upper directory in the layer store can be mounted here
    (not on every filesystem: e.g. an upper on overlayfs); the build goes without layers if not."""
    try:
        root_dir().mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".probe-", dir=root_dir()))
    except OSError:
        return False
    try:
        for sub in ("lower", "diff", "work", "merged"):
            (tmp / sub).mkdir()
        try:
            mount([tmp / "lower"], tmp / "diff", tmp / "work", tmp / "merged")
        except KitError:
            return False
        umount(tmp / "merged")
        return True
    finally:
        files.remove_tree(tmp)


def umount(target: Path) -> None:
    run(["umount", str(target)], check=False, what="build")


def new(claim: Claim) -> Path:
    """A layer being made (claimed): its directory holds ``diff`` and ``work``. Publish it with :func:`publish`."""
    root_dir().mkdir(parents=True, exist_ok=True)
    with cache_lock():
        tmp = Path(tempfile.mkdtemp(prefix=".new-", dir=root_dir()))
        claim.add(f"layers/{tmp.name}")
    (tmp / "diff").mkdir()
    (tmp / "work").mkdir()
    return tmp


def publish(tmp: Path, layer_key: str, config: unpack.ImageConfig, claim: Claim, *, replace: bool = False) -> Path:
    """Publish the layer made in ``tmp`` as ``layer_key``; returns the diff directory to stack.

    A layer already published (by another build, or before a ``--no-cache`` build) is
    never replaced while a running build may stack it: the existing one is kept and
    ``tmp`` goes, unless ``tmp`` was rebuilt on purpose (``--no-cache``), in which case
    this build stacks its own copy and publishes it only where no running build uses
    the old one."""
    files.remove_tree(tmp / "work")
    (tmp / "config.json").write_text(json.dumps(asdict(config), sort_keys=True))
    final = root_dir() / layer_key
    with cache_lock(exclusive=replace and final.exists()):
        claim.add(f"layers/{layer_key}")
        if final.exists() and not replace:
            files.remove_tree(tmp)
            return final / "diff"
        if final.exists():
            if f"layers/{layer_key}" in _live_claims() - claim.names:
                claim.private.append(tmp)  # in use elsewhere: ours stays private until this build ends
                return tmp / "diff"
            old = Path(tempfile.mkdtemp(prefix=".old-", dir=root_dir()))
            os.rename(final, old / "layer")
            files.remove_tree(old)
        try:
            os.rename(tmp, final)
        except OSError:  # made meanwhile by another build: keep that one
            files.remove_tree(tmp)
    return final / "diff"


def discard(tmp: Path) -> None:
    files.remove_tree(tmp)


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or under ``path`` (deepest first), from this process's mount table."""
    found = []
    prefix = str(path)
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            point = line.split()[4].encode("latin-1", "surrogateescape").decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def remove(path: Path) -> None:
    """Remove a cache entry or a build's leftover directory: what is mounted under it
    is unmounted first (never deleted through), then the entry."""
    if path.is_dir() and not path.is_symlink():
        for point in mounts_under(path):
            run(["umount", "--lazy", str(point)], check=False, what="build")
        files.remove_tree(path)
    else:
        path.unlink(missing_ok=True)


LEFTOVER = (".new-", ".old-", ".probe-")  # layers a dead build was making or replacing


def prune(limit_bytes: int, progress=lambda msg: None) -> tuple[int, int]:
    """Remove what dead builds left, then the least recently used layers and cached
    images that no running build uses, until the cache is under ``limit_bytes``;
    returns (entries removed, bytes freed)."""
    cache = cache_root()
    removed = freed = 0
    with cache_lock(exclusive=True):
        used = _live_claims()
        entries = []
        for folder in (root_dir(), cache / "images", cache / "images" / "stages"):
            if not folder.is_dir():
                continue
            for entry in folder.iterdir():
                name = entry.relative_to(cache).as_posix()
                if name in used or entry.name == "stages":
                    continue
                size = _size(entry) if entry.is_dir() and not entry.is_symlink() else entry.lstat().st_size
                if entry.name.startswith(".") and (entry.name.startswith(LEFTOVER) or ".tmp" in entry.name):
                    progress(f"removing {entry}: left by a build that did not finish")
                    remove(entry)
                    removed, freed = removed + 1, freed + size
                elif not entry.name.startswith("."):
                    entries.append((entry.lstat().st_mtime, entry, size))
        total = sum(size for _, _, size in entries)
        for _, entry, size in sorted(entries, key=lambda e: e[0]):
            if total <= limit_bytes:
                break
            progress(f"removing {entry} ({size / 2**20:.1f} MiB)")
            remove(entry)
            total -= size
            freed += size
            removed += 1
    return removed, freed
