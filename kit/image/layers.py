"""The per-instruction build cache: every step's result kept as an overlay layer.

A layer is the overlayfs upper directory a step wrote (whiteouts for what it
removed included) plus the image configuration after it, stored under
``$KIT_HOME/cache/layers/<key>``. A step's key hashes its parent's key, the
step itself and the fingerprint of what it copies, so a changed line rebuilds
from that line on and an unchanged one is found, not run. The bottom layer is
the base (a rootfs base directory is used in place). A layer appears whole or
not at all (it is written under a temporary name, then renamed).

``kit build --prune`` keeps the cache under a size (least recently used
layers and images go first).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from kit.image import unpack
from kit.home import kit_home
from kit.errors import KitError
from kit.runner import run


def root_dir() -> Path:
    return kit_home() / "cache" / "layers"


def key(parent: str, step: object, extra: str = "") -> str:
    text = json.dumps([parent, step, extra], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]  # short: many fit in overlay's option string


def lookup(layer_key: str) -> unpack.ImageConfig | None:
    """The configuration after a cached layer, or None when it is not cached."""
    meta = root_dir() / layer_key / "config.json"
    if not meta.is_file():
        return None
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
        shutil.rmtree(tmp, ignore_errors=True)


def umount(target: Path) -> None:
    run(["umount", str(target)], check=False, what="build")


def new():
    """A layer being made: (its directory, diff dir, overlay work dir). Publish it with :func:`publish`."""
    root_dir().mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".new-", dir=root_dir()))
    (tmp / "diff").mkdir()
    (tmp / "work").mkdir()
    return tmp


def publish(tmp: Path, layer_key: str, config: unpack.ImageConfig) -> None:
    shutil.rmtree(tmp / "work", ignore_errors=True)
    (tmp / "config.json").write_text(json.dumps(asdict(config), sort_keys=True))
    final = root_dir() / layer_key
    if final.exists():  # rebuilt without the cache (--no-cache): the new layer replaces it
        old = Path(tempfile.mkdtemp(prefix=".old-", dir=root_dir()))
        os.rename(final, old / "layer")
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.rename(tmp, final)
    except OSError:  # made meanwhile by another build: keep that one
        shutil.rmtree(tmp, ignore_errors=True)


def discard(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def prune(limit_bytes: int, progress=lambda msg: None) -> tuple[int, int]:
    """Remove the least recently used layers and cached images until the cache
    is under ``limit_bytes``; returns (entries removed, bytes freed)."""
    cache = kit_home() / "cache"
    entries = []
    for folder in (root_dir(), cache / "images", cache / "images" / "stages"):
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            if entry.name.startswith(".") or entry.name == "stages":
                continue
            entries.append((entry.stat().st_mtime, entry, _size(entry) if entry.is_dir() else entry.stat().st_size))
    total = sum(size for _, _, size in entries)
    removed = freed = 0
    for _, entry, size in sorted(entries, key=lambda e: e[0]):
        if total <= limit_bytes:
            break
        progress(f"removing {entry} ({size / 2**20:.1f} MiB)")
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        total -= size
        freed += size
        removed += 1
    return removed, freed
