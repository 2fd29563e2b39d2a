"""kit's runtime inside an image: the Python package at /opt/kit/python.

Images kit builds carry it (the ``kit = true`` step); for an image kit did
not build, ``kit launch`` mounts the same bundle from the host (see
:func:`bundle_dir`) instead of requiring a rebuild.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from kit import files
from kit.core import bash
from kit.image import rootpath
from kit.version import __version__

IMAGE_PREFIX = "/opt/kit"
PTH_NAME = "kit-runtime.pth"


def package_dir() -> Path:
    return Path(__file__).resolve().parent.parent


def package_files() -> list[Path]:
    """Every file of the installed kit package, templates included, sorted."""
    root = package_dir()
    files = [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    tpl = bash.templates_dir()
    if not str(tpl).startswith(str(root)):
        files += [p for p in tpl.iterdir() if p.is_file() and p.suffix in (".sh", ".py")]
    return sorted(files)


def install(dest_root: Path) -> Path:
    """Copy the runtime to ``dest_root``/opt/kit; returns the python dir inside."""
    base = rootpath.directory(dest_root, IMAGE_PREFIX)
    pydir = base / "python"
    rootpath.clear(pydir)
    src = package_dir()
    for path in package_files():
        if str(path).startswith(str(src)):
            rel = Path("kit") / path.relative_to(src)
        else:  # templates mapped from the source tree's launch/
            rel = Path("kit") / "templates" / path.name
        target = pydir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    rootpath.write_text(dest_root, f"{IMAGE_PREFIX}/VERSION", __version__ + "\n")
    return pydir


def bundle() -> Path:
    """kit's runtime laid out for mounting at /opt/kit (under $KIT_HOME/runtime)."""
    from kit.home import kit_home

    base = kit_home() / "runtime" / __version__
    ready = base / "opt" / "kit" / "VERSION"
    if not ready.exists():
        tmp = base.with_name(f".{base.name}.tmp{os.getpid()}")
        files.remove_tree(tmp)
        install(tmp)
        files.remove_tree(base)
        os.replace(tmp, base)
    return base / "opt" / "kit"
