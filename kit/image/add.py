"""A Dockerfile's COPY and ADD, with Docker's rules.

A directory source copies its contents into DEST; a file goes to DEST, or
into it when DEST ends with ``/`` or is a directory. ADD unpacks a local tar
archive (any compression Python reads) into DEST. ``--chmod``
applies to everything copied; ``.dockerignore`` leaves context files out;
``--from=STAGE`` copies out of an earlier stage's image.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path

from kit.errors import KitError
from kit.image import ignore as ignores
from kit.image import rootpath, unpack
from kit.runner import run


def _walk(path: Path):
    yield path
    if path.is_dir() and not path.is_symlink():
        for dirpath, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                yield Path(dirpath) / name


def apply(root: Path, value: dict, label: str, stage_image: Path | None) -> None:
    dst = value["dst"]
    with tempfile.TemporaryDirectory(prefix="kit-add-") as tmp:
        if "stage" in value:
            # Out of an earlier stage's image: unsquashfs extracts the one path.
            inner = value["src"].strip("/")
            out = Path(tmp) / "x"
            run(
                ["unsquashfs", "-no-progress", "-d", str(out), str(stage_image), *([inner] if inner else [])],
                what="COPY --from",
                timeout=None,
            )
            src = out / inner if inner else out
            if not src.exists() and not src.is_symlink():
                raise KitError(f"COPY --from={value['stage']}: {value['src']} is not in that stage", field=label)
            skip = None
        else:
            src = Path(value["src"])
            if not src.exists() and not src.is_symlink():
                raise KitError(f"source does not exist: {src}", field=label)
            context = Path(value["context"])
            ignore = ignores.Ignore(value.get("ignore", []))

            def excluded(p: Path) -> bool:
                return ignore.skips(p.relative_to(context).as_posix(), p.is_dir() and not p.is_symlink())

            skip = excluded
            if value.get("extract") and src.is_file() and tarfile.is_tarfile(src):
                # The same checked unpacker as a base's layers: no member, hard link or
                # symlink on a member's way leads out of the scratch root.
                out = Path(tmp) / "x"
                out.mkdir()
                try:
                    unpack.unpack_tarball(out, src, layer=False)
                except KitError as e:
                    raise KitError(
                        f"{src.name}: {e.message}",
                        field=label,
                        hint="the archive is malformed or unsafe; nothing was written",
                    ) from None
                src, skip = out, None
        is_dir = src.is_dir() and not src.is_symlink()
        if is_dir:
            target = rootpath.directory(root, dst)
            children = sorted(src.iterdir())
        else:
            target = rootpath.inside(root, dst, follow_last=True)
            if dst.endswith("/") or target.is_dir():
                target = rootpath.inside(root, rootpath.relative(root, rootpath.directory(root, dst) / src.name))
            children = [src]
        written = []
        for child in children:
            if skip and skip(child):
                continue
            where = target if not is_dir else rootpath.inside(root, rootpath.relative(root, target / child.name))
            try:
                rootpath.copy_into(root, child, where, skip=skip)
            except KitError as e:
                raise KitError(e.message, field=label) from None
            written.append(where)
    mode = int(value["chmod"], 8) if "chmod" in value else None
    for top in written if mode is not None else []:
        for path in _walk(top):
            if not path.is_symlink():
                os.chmod(path, mode)
    if not written and not is_dir:
        raise KitError("nothing to copy: every source is excluded by .dockerignore", field=label)
