"""`kit convert`'s container fields as kit runs them: the submission directory kit already shows the job (its code
view, and the work tree at its own path), and an image that has python3 alone."""

from __future__ import annotations

import os
import re
from pathlib import Path

from kit.errors import KitError
from kit.slurm.sbatch_words import PYTHONS

CODE_VIEW = (
    "kit starts the job in its code view of it (a copy taken at submission, under the job directory), "
    "so the job runs the code it was submitted with, not what the directory holds when it starts"
)


def submission_paths(fields: dict, changed: list[str], cwd: str | None) -> None:
    """Drop what names the directory the job is submitted from (or its work tree): a container working directory
    there, and a mount of it onto itself — kit shows the job that directory already, and such a mount would cover
    the job directory kit keeps under it (``kit launch`` refuses that)."""
    if not cwd:
        return
    own = {os.path.realpath(cwd), *([str(top)] if (top := _work_tree(Path(cwd))) else [])}
    workdir = fields.get("container_workdir")
    if workdir and os.path.realpath(workdir) in own:
        del fields["container_workdir"]
        changed.append(f"--container-workdir={workdir}: the directory you submit from: {CODE_VIEW}")
    mounts = fields.get("mounts")
    for mount in list(mounts or ()):
        src, _, rest = mount.partition(":")
        dst = rest.split(":", 1)[0]
        if src and dst and os.path.realpath(src) == os.path.realpath(dst) and os.path.realpath(src) in own:
            mounts.remove(mount)
            changed.append(
                f"--container-mounts {mount}: the directory you submit from, mounted onto itself: dropped; {CODE_VIEW}, "
                "and shows the directory itself at its own path (the mount would cover the job directory under it)"
            )
    if mounts == []:
        del fields["mounts"]


def _work_tree(cwd: Path) -> Path | None:
    """The git work tree ``cwd`` is in (what kit snapshots), if any."""
    here = Path(os.path.realpath(cwd))
    for d in (here, *here.parents):
        if (d / ".git").exists():
            return d
    return None


def python3(fields: dict, changed: list[str], inspect) -> None:
    """A command that runs ``python`` in an image that has python3 alone (Debian's, kit's) runs python3."""
    command, image = fields.get("command"), fields.get("image")
    if not command or not isinstance(image, str) or not os.path.isfile(image):
        return
    text = command[2] if command[:2] == ["bash", "-c"] else None
    if command[0] != "python" if text is None else not re.search(r"(?<![\w/.-])python(?=\s)", text):
        return
    try:
        found = {p.rsplit("/", 1)[1] for p in inspect(Path(image), list(PYTHONS))}
    except KitError:
        return  # an image it cannot read: kit launch says so
    if "python" in found or "python3" not in found:
        return
    if text is None:
        command[0] = "python3"
    else:
        command[2] = re.sub(r"(?<![\w/.-])python(?=\s)", "python3", text)
    changed.append(f"python: {image} has python3 alone: the command runs python3")
