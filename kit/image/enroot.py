"""The metadata files `enroot import` writes into an image, from an image config.

Laid out exactly as enroot 4.x writes them, so enroot and pyxis treat a
kit-built image like one they imported:

- ``/etc/environment``: the config's Env, one ``KEY=VALUE`` a line;
- ``/etc/rc``: labels as ``# KEY VALUE`` comments (and a blank line), then
  ``mkdir -p``/``cd`` to the working directory, source ``/etc/rc.local`` when
  it is not empty, and ``exec`` the entrypoint with the arguments given, or
  with CMD when none (``/bin/sh`` when there is neither);
- ``/etc/rc.local``: two comment lines;
- ``/etc/fstab``: one bind line per VOLUME.
"""

from __future__ import annotations

from pathlib import Path

from kit.image import rootpath
from kit.image.unpack import ImageConfig

RC_LOCAL = (
    "# This file is sourced by /etc/rc when the container starts.\n"
    "# It can be used to manipulate the entrypoint or the command of the container.\n"
)


def bash_at_q(word: str) -> str:
    """The quoting of bash's ``${var@Q}``, which enroot uses for the exec line."""
    if any(ord(c) < 32 or ord(c) == 127 for c in word):
        escapes = {
            "\n": "\\n",
            "\t": "\\t",
            "\r": "\\r",
            "\\": "\\\\",
            "'": "\\'",
            "\x1b": "\\E",
            "\a": "\\a",
            "\b": "\\b",
            "\f": "\\f",
            "\v": "\\v",
        }
        body = "".join(escapes.get(c) or (f"\\{ord(c):03o}" if ord(c) < 32 or ord(c) == 127 else c) for c in word)
        return f"$'{body}'"
    return "'" + word.replace("'", "'\\''") + "'"


def environment(config: ImageConfig) -> str:
    return "".join(f"{item}\n" for item in config.env)


def fstab(config: ImageConfig) -> str:
    return "".join(
        f"${{ENROOT_ROOTFS}}{v} {v} none x-create=dir,bind,rw,nosuid,nodev\n" for v in sorted(config.volumes)
    )


def rc(config: ImageConfig) -> str:
    lines = [f"# {k} {v}" for k, v in config.labels.items()]
    out = "".join(line + "\n" for line in lines)
    if out:
        out += "\n"
    cmd = config.cmd
    if not config.entrypoint and not cmd:
        cmd = ["/bin/sh"]
    entry = " ".join(bash_at_q(w) for w in config.entrypoint)
    workdir = config.workdir or "/"
    out += (
        f'mkdir -p "{workdir}" 2> /dev/null\n'
        f'cd "{workdir}" && unset OLDPWD || exit 1\n'
        "\n"
        "if [ -s /etc/rc.local ]; then\n"
        "    . /etc/rc.local\n"
        "fi\n"
        "\n"
        "if [ $# -gt 0 ]; then\n"
        f'    exec {entry} "$@"\n'
        "else\n"
        f"    exec {entry} {' '.join(bash_at_q(w) for w in cmd)}\n"
        "fi\n"
    )
    return out


def write(root: Path, config: ImageConfig) -> None:
    """Write the four files into ``root`` and create the working directory."""
    for name, text in (
        ("fstab", fstab(config)),
        ("environment", environment(config)),
        ("rc", rc(config)),
        ("rc.local", RC_LOCAL),
    ):
        rootpath.write_text(root, f"/etc/{name}", text)
    rootpath.directory(root, config.workdir or "/")
