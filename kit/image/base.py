"""A recipe's base, made the bottom of the image's root: checked before the build, then
unpacked (a directory, a tarball, an OCI layout, a docker archive, a squashfs image, an
image enroot pulls, or an earlier stage), its /dev dropped as `enroot import` drops it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from kit.errors import KitError
from kit.image import is_squashfs, rootpath, unpack
from kit.image.info import METADATA
from kit.image.recipe import Recipe
from kit.runner import run


def check(recipe: Recipe) -> None:
    b = recipe.base
    label = f"{recipe.label}: base"
    if b.kind in ("scratch", "stage"):
        return
    if b.kind == "image":
        if shutil.which("enroot") is None:
            raise KitError(
                f"cannot pull {b.value}: enroot is not installed",
                field=label,
                hint="install enroot, or save the image (docker save / skopeo copy) and use it as "
                "a docker-archive or oci base",
            )
        return
    p = Path(b.value)
    if not p.exists():
        raise KitError(
            f"{b.kind} base does not exist: {p}",
            field=label,
            hint="make it first (see containers/README.md), or pass --base KIND=PATH",
        )
    want_dir = b.kind in ("rootfs", "oci")
    if want_dir != p.is_dir():
        raise KitError(f"{b.kind} base must be a {'directory' if want_dir else 'file'}: {p}", field=label)
    if b.kind == "squashfs" and not is_squashfs(p):
        raise KitError(f"not a squashfs image: {p}", field=label)


def drop_dev(root: Path) -> None:
    """``dev/*`` goes, as `enroot import` drops it."""
    dev = root / "dev"
    if dev.is_dir() and not dev.is_symlink():
        for child in dev.iterdir():
            rootpath.clear(child)


def unpack_base(
    recipe: Recipe, root: Path, work: Path, progress, copy: bool = True, stage_images: dict[str, Path] | None = None
) -> unpack.ImageConfig:
    b = recipe.base
    path = Path(b.value) if b.kind != "stage" else (stage_images or {})[b.value]
    if b.kind == "scratch":
        config = unpack.ImageConfig()
    elif b.kind == "rootfs":
        if copy:
            run(["cp", "-a", "--reflink=auto", f"{path}/.", str(root)], what="base", timeout=None)
        config = unpack.ImageConfig(env=read_environment(root))
    elif b.kind == "tarball":
        unpack.unpack_tarball(root, path)
        config = unpack.ImageConfig(env=read_environment(root))
    elif b.kind == "oci":
        config = unpack.unpack_oci(root, path, progress)
    elif b.kind == "docker-archive":
        config = unpack.unpack_docker_archive(root, path, progress)
    else:
        if b.kind == "image":
            path = work / "pulled.sqsh"
            run(["enroot", "import", "-o", str(path), b.value], what="base", timeout=None, stream=True)
        root.rmdir()
        run(["unsquashfs", "-no-progress", "-d", str(root), str(path)], what="base", timeout=None)
        meta = None
        meta_path = root / METADATA
        if meta_path.is_file():
            try:
                meta = json.loads(meta_path.read_text())
            except ValueError:
                meta = None
        if meta and isinstance(meta.get("config"), dict):
            config = unpack.ImageConfig(**meta["config"])
        else:
            config = unpack.ImageConfig(env=read_environment(root))
    drop_dev(root)
    return config


def read_environment(root: Path) -> list[str]:
    path = root / "etc" / "environment"
    if path.is_file() and not path.is_symlink():
        return [
            line
            for line in path.read_text(errors="replace").splitlines()
            if "=" in line and not line.lstrip().startswith("#")
        ]
    return []
