"""Building and inspecting images: a recipe into a reproducible squashfs image that enroot and pyxis run.

The build unpacks the base into a private root, applies the steps, writes
enroot's metadata files and kit's own ``/.kit/image.json``, and packs the
root with ``mksquashfs -all-root`` (lz4 with 128 KiB blocks unless told
otherwise; ``enroot`` gives enroot's own ``-comp lzo -noD``), with fixed timestamps so the same recipe and inputs give the same
bytes. Builds are cached by a digest of everything that goes in (the recipe,
and the size and mtime of every input file): an unchanged rebuild is a no-op.
Nothing is left behind on failure; the image appears by an atomic rename.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from kit.errors import KitError
from kit.home import kit_home
from kit.image import base, enroot, fingerprint, is_squashfs, layers, rootpath, runtime, steps, unpack
from kit.image.info import METADATA, image_metadata
from kit.image.recipe import COMPRESSION, DEFAULT_COMPRESSION, Recipe
from kit.runner import run
from kit.version import __version__


@dataclass
class BuildResult:
    image: Path
    digest: str
    source: str  # "built", "up to date", "cache"


def cache_dir() -> Path:
    return kit_home() / "cache" / "images"


def digest(recipe: Recipe, compression: str) -> str:
    inputs = {"kit": __version__, "recipe": recipe.as_dict(), "compression": compression}
    if recipe.base.kind not in ("image", "scratch", "stage"):
        inputs["base"] = fingerprint.of_path(Path(recipe.base.value))
    inputs["copies"] = [fingerprint.of_source(Path(v[0])) for k, v in recipe.steps if k == "copy"]
    inputs["adds"] = [fingerprint.of_add(v) for k, v in recipe.steps if k == "add" and "stage" not in v]
    inputs["stages"] = {name: digest(stage, compression) for name, stage in sorted(recipe.stages.items())}
    if any(k == "kit" for k, _ in recipe.steps):
        inputs["kit_runtime"] = steps.runtime_hash()
    text = json.dumps(inputs, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------- build
def private_mounts() -> bool:
    """Move this process into a mount namespace of its own (as root), so every overlay a
    build mounts goes when the build's processes end, however they end (SIGKILL
    included). For the `kit build` command: its process does nothing else. False where
    it cannot (not root): the build then unmounts as it goes."""
    if os.geteuid() != 0:
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    CLONE_NEWNS, MS_REC, MS_PRIVATE = 0x00020000, 0x4000, 0x40000
    if libc.unshare(CLONE_NEWNS) != 0:
        return False
    # Nothing mounted here propagates back to the host's namespace.
    return libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0


def build(
    recipe: Recipe,
    output: Path,
    *,
    compression: str = DEFAULT_COMPRESSION,
    use_cache: bool = True,
    progress=lambda msg: None,
) -> BuildResult:
    """Build ``recipe`` into ``output`` (and its earlier stages into the cache)."""
    fingerprint.forget()  # remembered for one build (its stages, built by _build, share bases), never longer
    try:
        with layers.Claim() as claim:
            return _build(recipe, output, compression=compression, use_cache=use_cache, progress=progress, claim=claim)
    finally:
        fingerprint.forget()


WORK_LOCK = ".lock"  # held (flock) by the build that owns a work directory


def _new_work_dir(output: Path) -> tuple[Path, int]:
    """The build's work directory next to the output (locked while it runs); the work
    directories of dead builds of the same output are removed first (unmounted, then deleted)."""
    prefix = f".{output.name}.build-"
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        for old in output.parent.iterdir():
            if old.name.startswith(prefix) and old.is_dir() and not old.is_symlink():
                try:
                    fd = os.open(old / WORK_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                except FileNotFoundError:
                    fd = None  # from an older kit, or killed before it locked: dead either way
                except OSError:
                    continue
                try:
                    if fd is not None:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a running build's
                finally:
                    if fd is not None:
                        os.close(fd)
                layers.remove(old)
        work = Path(tempfile.mkdtemp(prefix=prefix, dir=output.parent))
        fd = os.open(work / WORK_LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise KitError(
            f"cannot write in {output.parent}: {e.strerror}",
            field="--output",
            hint="choose a directory on a writable filesystem with room for the image",
        ) from None
    fcntl.flock(fd, fcntl.LOCK_EX)
    return work, fd


def _build(
    recipe: Recipe, output: Path, *, compression: str, use_cache: bool, progress, claim: layers.Claim
) -> BuildResult:
    if compression not in COMPRESSION:
        raise KitError(
            f"unknown compression {compression!r}", field="--compression", hint="one of " + ", ".join(COMPRESSION)
        )
    for tool in ("mksquashfs", "unsquashfs"):
        if shutil.which(tool) is None:
            raise KitError(
                f"{tool} not found", hint="install squashfs-tools (apt-get install -y squashfs-tools)", exit_code=1
            )
    if output.is_symlink() or (output.exists() and not output.is_file()):
        # The image replaces the path: never a device node, a directory or a link's target.
        raise KitError(
            f"{output} exists and is not a regular file",
            field="--output",
            hint="give a new path, or the path of an image to replace",
        )
    base.check(recipe)
    output = output.resolve()
    key = digest(recipe, compression)
    if output.exists() and is_squashfs(output):
        meta = image_metadata(output)
        if meta and meta.get("digest") == key:
            return BuildResult(output, key, "up to date")
    work, lock = _new_work_dir(output)
    cached = cache_dir() / f"{key}.sqsh"
    overlay = False
    root = work / "root"
    try:
        with layers.cache_lock():
            claim.add(cached.relative_to(layers.cache_root()).as_posix())
            hit = use_cache and cached.exists()
        if hit:
            _place(cached, output)
            return BuildResult(output, key, "cache")
        stage_images = _build_stages(recipe, compression, use_cache, progress, claim)
        root.mkdir()
        total = len(recipe.steps) + 2
        progress(f"[1/{total}] base: {recipe.base.describe()}")
        # Every step goes through the per-instruction cache where overlays can be mounted: a
        # TOML recipe and a Dockerfile with the same steps share their layers.
        config = _layered_root(recipe, root, work, progress, stage_images, total, use_cache, claim)
        overlay = config is not None
        if config is None:
            overlay = recipe.base.kind == "rootfs" and _mount_overlay(Path(recipe.base.value), work)
            config = base.unpack_base(recipe, root, work, progress, copy=not overlay, stage_images=stage_images)
            for i, (kind, value) in enumerate(recipe.steps, 2):
                progress(f"[{i}/{total}] {kind}: {steps.STEPS[kind].describe(value)}")
                _apply(kind, root, value, config, recipe.step_label(i - 2, kind), stage_images, progress)
        _finish_config(recipe, config)
        _write_metadata(root, config, recipe, key, compression)
        progress(f"[{total}/{total}] mksquashfs ({compression}) -> {output}")
        packed = work / "image.sqsh"
        _mksquashfs(root, packed, compression)
        os.replace(packed, output)  # the image first: a full cache must not cost the user it
        if use_cache:
            with layers.cache_lock():
                claim.add(_partial(cached).relative_to(layers.cache_root()).as_posix())
            try:
                _place(output, cached)
            except OSError as e:
                progress(f"warning: the image is built, but not kept in the cache ({e.strerror}): {cached.parent}")
    finally:
        if overlay:
            run(["umount", "--lazy", str(root)], check=False)
        layers.remove(work)
        os.close(lock)
    return BuildResult(output, key, "built")


def _mount_overlay(base: Path, work: Path) -> bool:
    """Put ``work``/root over the rootfs ``base`` (an overlay), so the base is not copied.

    Steps write to ``work``/upper; the base is never changed. False where
    overlay mounts are not allowed (then the base is copied instead).
    """
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    (work / "upper").mkdir()
    (work / "ovl-work").mkdir()
    try:
        layers.mount([base], work / "upper", work / "ovl-work", work / "root")
    except KitError:  # a comma or colon in the path, or no overlay here
        return False
    return True


def _partial(dst: Path) -> Path:
    """Where :func:`_place` writes ``dst`` before renaming it into place."""
    return dst.with_name(f".{dst.name}.tmp{os.getpid()}")


def _place(src: Path, dst: Path) -> None:
    """Hard-link (or copy) ``src`` to ``dst`` atomically; nothing partial is left on failure."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _partial(dst)
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(src, tmp)  # never follows a name planted at tmp: it fails
        except OSError as e:
            if e.errno == errno.EEXIST:
                raise
            with (
                open(src, "rb") as r,
                os.fdopen(
                    os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644), "wb"
                ) as w,
            ):
                shutil.copyfileobj(r, w, 1 << 20)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _apply(kind: str, root: Path, value, config, label: str, stage_images: dict[str, Path], progress) -> None:
    """One step on ``root``; what a long step says of itself (pip's packages) goes to ``progress``, indented."""
    token = steps.SAY.set(lambda message: progress(f"  {message}"))
    try:
        steps.STEPS[kind].apply(root, value, config, label, stage_images)
    finally:
        steps.SAY.reset(token)


def _layered_root(
    recipe: Recipe,
    root: Path,
    work: Path,
    progress,
    stage_images: dict[str, Path],
    total: int,
    use_cache: bool,
    claim: layers.Claim,
) -> unpack.ImageConfig | None:
    """Every step from the layer cache, or run into a new layer (kit.image.layers);
    ``root`` ends as an overlay of them all over a scratch upper. None where
    overlays cannot be mounted (the caller then builds without the cache)."""
    if os.geteuid() != 0 or shutil.which("mount") is None or not layers.usable():
        return None
    b = recipe.base
    if b.kind == "rootfs":  # used in place, as the bottom layer
        parent = layers.key("base", [b.kind, b.value], fingerprint.of_path(Path(b.value)))
        lowers = [Path(b.value)]
        config = unpack.ImageConfig(env=base.read_environment(Path(b.value)))
    else:
        identity = (
            str(stage_images[b.value])
            if b.kind == "stage"
            else ("" if b.kind in ("scratch", "image") else fingerprint.of_path(Path(b.value)))
        )
        parent = layers.key("base", [b.kind, b.value], identity)
        config = layers.lookup(parent, claim) if use_cache else None
        if config is None:
            tmp = layers.new(claim)
            try:
                config = base.unpack_base(recipe, tmp / "diff", work, progress, stage_images=stage_images)
            except BaseException:
                layers.discard(tmp)
                raise
            lowers = [layers.publish(tmp, parent, config, claim, replace=not use_cache)]
        else:
            lowers = [layers.diff(parent)]
    for i, (kind, value) in enumerate(recipe.steps, 2):
        step_key = layers.key(parent, [kind, value], steps.STEPS[kind].cache_key(value, stage_images))
        cached = layers.lookup(step_key, claim) if use_cache else None
        if cached is not None:
            progress(f"[{i}/{total}] cached: {kind}: {steps.STEPS[kind].describe(value)}")
            config = cached
            lowers.insert(0, layers.diff(step_key))
        else:
            progress(f"[{i}/{total}] {kind}: {steps.STEPS[kind].describe(value)}")
            tmp = layers.new(claim)
            merged = work / f"step-{i}"
            merged.mkdir()
            try:
                layers.mount(lowers, tmp / "diff", tmp / "work", merged)
                try:
                    _apply(kind, merged, value, config, recipe.step_label(i - 2, kind), stage_images, progress)
                finally:
                    layers.umount(merged)
            except BaseException:
                layers.discard(tmp)
                raise
            lowers.insert(0, layers.publish(tmp, step_key, config, claim, replace=not use_cache))
        parent = step_key
    (work / "upper").mkdir()
    (work / "ovl-work").mkdir()
    layers.mount(lowers, work / "upper", work / "ovl-work", root)
    base.drop_dev(root)
    return config


def _build_stages(recipe: Recipe, compression: str, use_cache: bool, progress, claim: layers.Claim) -> dict[str, Path]:
    """Build the earlier Dockerfile stages ``recipe`` uses (kept in the cache,
    keyed by their digests): stage name -> image."""
    images = {}
    for name, stage in sorted(recipe.stages.items()):
        out = cache_dir() / "stages" / f"{digest(stage, compression)}.sqsh"
        progress(f"stage {name}:")
        with layers.cache_lock():
            claim.add(out.relative_to(layers.cache_root()).as_posix())
        _build(
            stage,
            out,
            compression=compression,
            use_cache=use_cache,
            progress=lambda msg, name=name: progress(f"  {name}: {msg}"),
            claim=claim,
        )
        images[name] = out
    return images


def _finish_config(recipe: Recipe, config: unpack.ImageConfig) -> None:
    if recipe.entrypoint is not None:
        config.entrypoint = list(recipe.entrypoint)
    if recipe.cmd is not None:
        config.cmd = list(recipe.cmd)
    config.labels.update(recipe.labels)
    config.volumes = sorted(set(config.volumes) | set(recipe.volumes))


def _write_metadata(root: Path, config: unpack.ImageConfig, recipe: Recipe, key: str, compression: str) -> None:
    enroot.write(root, config)
    version_file = rootpath.inside(root, f"{runtime.IMAGE_PREFIX}/VERSION")
    meta = {
        "kit_version": __version__,
        "digest": key,
        "recipe": recipe.path.name,
        "description": recipe.description,
        "base": recipe.base.kind,
        "compression": compression,
        "kit_runtime": version_file.read_text().strip() if version_file.is_file() else None,
        "config": asdict(config),
    }
    rootpath.write_text(root, METADATA, json.dumps(meta, indent=2, sort_keys=True) + "\n")


def _mksquashfs(root: Path, out: Path, compression: str) -> None:
    argv = [
        "mksquashfs",
        str(root),
        str(out),
        "-noappend",
        "-all-root",
        "-mkfs-time",
        "0",
        "-all-time",
        "0",
        "-processors",
        str(os.cpu_count() or 1),
        *COMPRESSION[compression],
    ]
    tty = sys.stderr.isatty()
    if not tty:
        argv += ["-no-progress", "-quiet"]
    run(argv, what="mksquashfs", timeout=None, stream=tty)
