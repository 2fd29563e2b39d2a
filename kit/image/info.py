"""Reading a built image without unpacking it: one file's text, which paths exist, kit's
metadata (``/.kit/image.json``), and `kit build --inspect`'s summary."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kit.errors import KitError
from kit.image import is_squashfs
from kit.runner import run, tail

METADATA = ".kit/image.json"


def read_file(image: Path, inner: str) -> str | None:
    """One file's text from inside a squashfs image (None if absent)."""
    proc = run(["unsquashfs", "-cat", str(image), inner], check=False, timeout=120)
    return proc.stdout if proc.returncode == 0 else None


def image_has(image: Path, paths: list[str], *, shown: str | None = None, field: str | None = None) -> set[str]:
    """Which of ``paths`` (relative to the image root) exist in the image; an unreadable image is
    named ``shown`` (the file the user gave, where ``image`` is its pinned copy), for ``field``."""
    proc = run(["unsquashfs", "-l", "-d", "/", str(image), *paths], check=False, timeout=120)
    if proc.returncode != 0 and not proc.stdout.strip():
        raise KitError(
            f"cannot read {shown or image}: truncated or damaged (unsquashfs exit {proc.returncode})",
            field=field,
            detail=tail(proc.stderr or ""),
            hint="build it again, or copy it again if it was copied",
        )
    listed = {line.strip().lstrip("/") for line in proc.stdout.splitlines()}
    return {p for p in paths if p.strip("/") in listed}


def list_paths(image: Path) -> list[str]:
    """Every path in the image, relative to its root (``unsquashfs -l``; nothing is unpacked)."""
    proc = run(["unsquashfs", "-l", "-d", "/", str(image)], check=False, timeout=300)
    if proc.returncode != 0 and not proc.stdout.strip():
        raise KitError(
            f"cannot read {image}: truncated or damaged (unsquashfs exit {proc.returncode})",
            detail=tail(proc.stderr or ""),
            hint="build it again, or copy it again if it was copied",
        )
    return [line.strip().lstrip("/") for line in proc.stdout.splitlines() if line.strip()]


def image_metadata(image: Path) -> dict | None:
    text = read_file(image, METADATA)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


@dataclass
class ImageInfo:
    path: Path
    size: int
    compression: str
    env: list[str]
    workdir: str
    entrypoint: list[str]
    cmd: list[str]
    digest: str | None
    kit_runtime: str | None


def inspect(image: Path) -> ImageInfo:
    if not image.exists():
        raise KitError(f"no such image: {image}", field="IMAGE")
    if not is_squashfs(image):
        raise KitError(f"not a squashfs image: {image}", field="IMAGE")
    proc = run(["unsquashfs", "-s", str(image)], what="unsquashfs")
    compression = "?"
    no_data = "Data is uncompressed" in proc.stdout
    for line in proc.stdout.splitlines():
        if line.startswith("Compression "):
            compression = line.split()[1] + (" (data blocks uncompressed: -noD)" if no_data else "")
    meta = image_metadata(image) or {}
    config = meta.get("config") or {}
    env = config.get("env")
    if env is None:
        env = [line for line in (read_file(image, "etc/environment") or "").splitlines() if line]
    version = meta.get("kit_runtime") or (read_file(image, "opt/kit/VERSION") or "").strip() or None
    return ImageInfo(
        path=image,
        size=image.stat().st_size,
        compression=compression,
        env=env,
        workdir=config.get("workdir", ""),
        entrypoint=config.get("entrypoint", []),
        cmd=config.get("cmd", []),
        digest=meta.get("digest"),
        kit_runtime=version,
    )
