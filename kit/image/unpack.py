"""Unpacking image layers into a build root, safely.

Every tar member is checked before anything is written: no absolute names,
no ``..``; symlinks on a member's way are resolved within the root (an
image's ``/opt -> /host/dir`` leads to the image's ``/host/dir``, never the
host's); a hard link must name a regular file inside the root. Device nodes are skipped and ``dev/*`` is dropped
(as ``enroot import`` does). OCI whiteouts are applied per layer: ``.wh.NAME``
deletes NAME from the layers below, ``.wh..wh..opq`` empties a directory of
what the layers below put there.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from kit.errors import KitError
from kit.image import rootpath

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


@dataclass
class ImageConfig:
    """The parts of an OCI/Docker image config kit carries over."""

    env: list[str] = field(default_factory=list)
    workdir: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_oci(cls, doc: dict) -> "ImageConfig":
        c = doc.get("config") or doc.get("Config") or {}
        return cls(
            env=list(c.get("Env") or []),
            workdir=c.get("WorkingDir") or "",
            entrypoint=list(c.get("Entrypoint") or []),
            cmd=list(c.get("Cmd") or []),
            volumes=sorted((c.get("Volumes") or {}).keys()),
            labels=dict(c.get("Labels") or {}),
        )


def _bad(source: str, message: str) -> KitError:
    return KitError(
        message, field=source, hint="the base image is malformed or unsafe; nothing was written outside the build root"
    )


def _member_path(root: Path, name: str, source: str, drop_dev: bool = True) -> Path | None:
    """Where a member named ``name`` lands in ``root``, symlinks on the way
    resolved within it (:func:`kit.image.rootpath.inside`); None to skip it."""
    p = PurePosixPath(name)
    if p.is_absolute():
        raise _bad(source, f"archive member has an absolute path: {name!r}")
    parts = [part for part in p.parts if part not in ("", ".")]
    if ".." in parts:
        raise _bad(source, f"archive member leaves the root: {name!r}")
    if not parts:
        return None
    if drop_dev and parts[0] == "dev" and len(parts) > 1:
        return None  # enroot drops dev/*
    try:
        return rootpath.inside(root, name)
    except KitError as e:
        raise _bad(source, f"archive member {name!r}: {e.message}") from None


def apply_layer(root: Path, tar: tarfile.TarFile, source: str, *, layer: bool = True) -> None:
    """Apply one layer (a tar stream) on top of ``root``; ``layer=False``: a plain
    archive (a Dockerfile's ``ADD``), whose ``.wh.`` names and ``dev/`` are ordinary."""
    members = []
    try:
        for m in tar:
            members.append(m)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise _bad(source, f"cannot read archive (corrupt or truncated): {str(e).splitlines()[0]}") from None
    # Pass 1: whiteouts remove what the layers below put there.
    for m in members if layer else []:
        base = PurePosixPath(m.name).name
        if not base.startswith(WHITEOUT):
            continue
        target = _member_path(root, m.name, source)
        if target is None:
            continue
        if base == OPAQUE:
            d = target.parent
            if d.is_dir() and not d.is_symlink():
                for child in d.iterdir():
                    rootpath.clear(child)
        else:
            victim = target.parent / base[len(WHITEOUT) :]
            if victim.exists() or victim.is_symlink():
                rootpath.clear(victim)
    # Pass 2: everything else, each member written at its resolved place.
    for m in members:
        if layer and PurePosixPath(m.name).name.startswith(WHITEOUT):
            continue
        target = _member_path(root, m.name, source, drop_dev=layer)
        if target is None or m.ischr() or m.isblk() or m.isfifo():
            continue
        link = None
        if m.islnk():
            link = _member_path(root, m.linkname, source, drop_dev=layer)
            if link is None or os.path.islink(link) or not link.is_file():
                raise _bad(source, f"hard link {m.name!r} -> {m.linkname!r}: target missing, not a file or a symlink")
        if target.is_symlink() or (target.exists() and not (m.isdir() and target.is_dir())):
            rootpath.clear(target)
        try:
            # An earlier member may have put a file where this one needs a directory (`d`, then
            # `d/x`): refused as a broken archive, as tar refuses it, never a traceback.
            target.parent.mkdir(parents=True, exist_ok=True)
            if link is not None:
                os.link(link, target)
            else:
                tar.extract(
                    m.replace(name=target.relative_to(root).as_posix(), deep=False),
                    root,
                    set_attrs=True,
                    numeric_owner=True,
                    filter="fully_trusted",
                )
        except (tarfile.TarError, OSError, EOFError) as e:
            raise _bad(source, f"cannot extract {m.name!r}: {e}") from None


def open_tar(fileobj: IO[bytes], source: str) -> tarfile.TarFile:
    """A tar reader for plain, gzip, bzip2 or xz data (zstd is not supported)."""
    head = fileobj.read(4)
    fileobj.seek(0)
    if head == b"\x28\xb5\x2f\xfd":
        raise _bad(source, "zstd-compressed layers are not supported")
    try:
        return tarfile.open(fileobj=fileobj, mode="r:*")
    except (tarfile.TarError, EOFError, OSError, zlib.error):
        raise _bad(source, "not a tar archive, or a corrupt one (plain, gzip, bzip2 or xz)") from None


def unpack_tarball(root: Path, path: Path, *, layer: bool = True) -> None:
    with open(path, "rb") as f:
        with open_tar(f, str(path)) as tar:
            apply_layer(root, tar, str(path), layer=layer)


def _sha256_file(f: IO[bytes]) -> str:
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
    return h.hexdigest()


def unpack_oci(root: Path, layout: Path, progress=lambda msg: None) -> ImageConfig:
    """An OCI image layout directory (index.json, blobs/sha256/...)."""
    src = str(layout)

    def blob(digest: str, verify: bool = True) -> Path:
        algo, _, hexd = digest.partition(":")
        path = layout / "blobs" / algo / hexd
        if not path.is_file():
            raise _bad(src, f"missing blob {digest}")
        if verify:
            with open(path, "rb") as f:
                if _sha256_file(f) != hexd:
                    raise _bad(src, f"blob {digest} does not match its digest (corrupt)")
        return path

    def read_json(path: Path) -> dict:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise _bad(src, f"cannot read {path.name}: {e}") from None

    index = read_json(layout / "index.json")
    manifests = index.get("manifests") or []
    if not manifests:
        raise _bad(src, "index.json lists no manifest")
    desc = manifests[0]
    for m in manifests:
        plat = m.get("platform") or {}
        if plat.get("architecture") in (None, "amd64") and plat.get("os") in (None, "linux"):
            desc = m
            break
    manifest = read_json(blob(desc["digest"]))
    if "manifests" in manifest:  # a nested index
        manifest = read_json(blob(manifest["manifests"][0]["digest"]))
    config = ImageConfig.from_oci(read_json(blob(manifest["config"]["digest"])))
    layers = manifest.get("layers") or []
    for i, layer in enumerate(layers, 1):
        progress(f"layer {i}/{len(layers)} {layer['digest'][:19]}")
        with open(blob(layer["digest"]), "rb") as f:
            with open_tar(f, src) as tar:
                apply_layer(root, tar, src)
    return config


def unpack_docker_archive(root: Path, path: Path, progress=lambda msg: None) -> ImageConfig:
    """A `docker save` tarball (manifest.json, config json, layer tars)."""
    src = str(path)
    try:
        outer = tarfile.open(path, mode="r:*")
    except (tarfile.TarError, OSError, EOFError, zlib.error):
        raise _bad(src, "not a tar archive, or a corrupt one") from None
    with outer:

        def member(name: str) -> IO[bytes]:
            try:
                f = outer.extractfile(name)
            except KeyError:
                f = None
            if f is None:
                raise _bad(src, f"missing {name} in the archive")
            return f

        try:
            manifest = json.load(member("manifest.json"))[0]
            config = ImageConfig.from_oci(json.load(member(manifest["Config"])))
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise _bad(src, f"unreadable manifest.json: {e}") from None
        layers = manifest.get("Layers") or []
        for i, name in enumerate(layers, 1):
            progress(f"layer {i}/{len(layers)} {name}")
            with open_tar(member(name), src) as tar:
                apply_layer(root, tar, src)
    return config
