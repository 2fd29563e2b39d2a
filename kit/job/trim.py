"""``kit trim``: free the pinned images and code snapshots no job needs any more.

Every launch pins its ``--image`` file (``$KIT_HOME/images``) and keeps its code in the
code store (``$KIT_HOME/code``, or ``<output-dir>/.kit-code-<uid>``), so that a pending
or requeued job runs what was submitted; nothing else ever removes them. A job still
needs them while Slurm may run it again: pending, running, or ended unfinished while
Slurm still knows it (an admin's ``scontrol requeue``), or while Slurm cannot say
(kept, never guessed). ``--keep JOB`` keeps a job's too, for a later ``kit rerun``.
Everything else goes; what was written in the last ``GRACE`` seconds stays (a launch
may be writing it now).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from kit import files, jobdir
from kit.code import store as codestore
from kit.errors import KitError
from kit.home import kit_home
from kit.image import pin
from kit.job import listing
from kit.jobdir import JobDir

GRACE = 600.0


@dataclass
class Trimmed:
    """What ``trim`` removed (or would remove, in a dry run), and why the rest stays."""

    images: list[str] = field(default_factory=list)  # pinned copies
    snapshots: int = 0  # manifests
    objects: int = 0  # code objects
    trees: int = 0  # code trees a login node laid out for --host launches
    freed: int = 0  # bytes
    kept_for: list[str] = field(default_factory=list)  # the jobs whose pins and snapshots stay
    dry_run: bool = False


def trim(output_dirs: list[Path], keep: list[Path] = (), dry_run: bool = False) -> Trimmed:
    """Remove every pinned image and code snapshot no job needs (see the module's text)."""
    needed = [Path(d) for d in keep]
    for d in needed:
        jobdir.own(d)
    rows = listing.list_jobs([Path(d) for d in output_dirs], everything=True)
    for row in rows:  # another user's directory in a shared output directory uses nothing of this user's
        if jobdir.owner(Path(row.job_dir)) != os.geteuid():
            continue
        if row.active or row.state == "UNKNOWN" or (row.state_from == "slurm" and not row.finished):
            needed.append(Path(row.job_dir))
    out = Trimmed(kept_for=sorted({str(d) for d in needed}), dry_run=dry_run)
    images, manifests, roots = set(), {}, set()
    for d in dict.fromkeys(needed):
        image, snap = _uses(d)
        if image:
            images.add(image)
        if snap:
            manifests.setdefault(snap.store, set()).add(snap.digest.partition(":")[2])
            roots.add(snap.root)
    _trim_pins(images, out)
    _trim_trees(roots, out)
    stores = {str(kit_home() / "code"), *(str(Path(o) / f".kit-code-{os.geteuid()}") for o in output_dirs), *manifests}
    for store in sorted(stores):
        _trim_store(Path(store), manifests.get(store, set()), out)
    return out


def _uses(job_dir: Path) -> tuple[str | None, codestore.Snapshot | None]:
    """The pinned image and the code snapshot a job directory's ``job.json`` names."""
    try:
        spec = files.read_json(jobdir.own(job_dir / JobDir.SPEC), 1 << 22)
    except (OSError, ValueError, KitError):
        raise KitError(
            f"cannot read {job_dir / JobDir.SPEC}: a job that may still run names its image and "
            "code there, so nothing is trimmed",
            field="JOB",
            exit_code=1,
        ) from None
    image = spec.get("image") if isinstance(spec, dict) else None
    snap = spec.get("snapshot") if isinstance(spec, dict) else None
    try:
        snap = codestore.Snapshot(**snap) if isinstance(snap, dict) else None
    except TypeError:
        snap = None
    return (image if isinstance(image, str) else None), snap


def _old(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return time.time() - max(st.st_mtime, st.st_ctime) > GRACE


def _remove(path: Path, out: Trimmed) -> bool:
    try:
        size = os.lstat(path).st_size
        if not out.dry_run:
            os.unlink(path)
    except OSError:
        return False
    out.freed += size
    return True


def _trim_pins(needed: set[str], out: Trimmed) -> None:
    directory = pin.pins()
    if not directory.is_dir():
        return
    try:
        with files.owned(directory, create=False) as here:
            for p in sorted(here.glob("sha256-*.sqsh")):
                if str(directory / p.name) not in needed and _old(p) and _remove(p, out):
                    out.images.append(str(directory / p.name))
    except files.NotOwned:
        raise KitError(f"{directory} is not a directory of this user's own", field="KIT_HOME", exit_code=1) from None


def _trim_trees(needed: set[str], out: Trimmed) -> None:
    """The trees a login node laid out for ``kit --host … launch`` (``$KIT_HOME/trees/<checkout>/<digest>``,
    a job's snapshot root): those no needed job runs from, unused for ``GRACE`` (each launch touches its own)."""

    trees = kit_home() / "trees"
    if not trees.is_dir():
        return
    try:
        with files.owned(trees, create=False) as top:
            for group in sorted(p for p in top.iterdir() if p.is_dir() and not p.is_symlink()):
                for tree in sorted(p for p in group.iterdir() if p.is_dir() and not p.is_symlink()):
                    if str(trees / group.name / tree.name) in needed or not _old(tree):
                        continue
                    out.freed += sum(os.lstat(f).st_size for f in tree.rglob("*") if not f.is_dir())
                    out.trees += 1
                    if not out.dry_run:
                        files.remove_tree(tree)
                if not out.dry_run and not any(group.iterdir()):
                    group.rmdir()
    except files.NotOwned:
        raise KitError(f"{trees} is not a directory of this user's own", field="KIT_HOME", exit_code=1) from None


def _trim_store(store: Path, needed: set[str], out: Trimmed) -> None:
    """A code store's manifests no needed snapshot names, then the objects no manifest left names."""
    if not store.is_dir():
        return
    try:
        with files.owned(store, create=False) as top, codestore.locked(top, exclusive=True):
            manifests, objects = top / "manifests", top / "objects"
            keep_objects = set()
            for m in sorted(manifests.glob("*.json")) if manifests.is_dir() else []:
                digest = m.name.removesuffix(".json")
                if digest not in needed and _old(m):
                    out.snapshots += _remove(m, out)
                    continue
                snap = codestore.Snapshot(f"sha256:{digest}", "", str(store), "", 0, 0)
                try:
                    keep_objects |= {
                        value for _, kind, value in codestore.entries(snap, manifests) if kind in ("f", "x")
                    }
                except KitError:  # a damaged manifest holds nothing a job can use
                    out.snapshots += _remove(m, out)
            for o in sorted(objects.iterdir()) if objects.is_dir() else []:
                if o.name.split(".")[0] not in keep_objects and _old(o):
                    out.objects += _remove(o, out)
    except files.NotOwned:
        return  # not this user's: nothing of it is theirs to trim
