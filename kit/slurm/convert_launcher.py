"""`kit convert` of a step that runs a launcher script which starts what kit's sidecars do: the launcher's text runs
in the command, without its ``nvidia-smi dmon … &``, the pid it keeps and the ``kill`` of it (kit's gpu-dmon sidecar
logs the same on every node and kit tears it down). Run as it is, the launcher fails where nvidia-smi is not (a CPU
image): its ``kill`` of a process that never started is its last command, so its exit status."""

from __future__ import annotations

import os
import re
import shlex

from kit.slurm import shellwords

DMON = re.compile(r"(?<![\w/.-])nvidia-smi\s+dmon\b")
PID = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=\$!\s*$")


def inline(fields: dict, changed: list[str], cwd: str | None, read) -> None:
    """Inline the launcher the command's last line runs, when it starts ``nvidia-smi dmon`` in the background.
    ``read(path) -> str`` reads a file (the launcher, relative to ``cwd``)."""
    command = fields.get("command") or []
    if not cwd or not command:
        return
    lines = command[2].split("\n") if command[:2] == ["bash", "-c"] else [shlex.join(command)]
    try:
        words = shlex.split(lines[-1])
    except ValueError:
        return
    if not words or "/" not in words[0] or words[0].startswith("/") or "$" in words[0]:
        return  # a launcher is a script beside the batch script (./launcher.sh), not a program on PATH
    path = os.path.join(cwd, words[0])
    try:
        text = read(path)
    except OSError:
        return
    first = text.split("\n", 1)[0]
    if first.startswith("#!") and not re.search(r"\b(?:ba)?sh\b", first):
        return  # not a shell script
    body, removed = _without_dmon(text.split("\n", 1)[1] if first.startswith("#!") else text)
    if not removed:
        return
    prefix = [f"set -- {shlex.join(words[1:])}"] if len(words) > 1 else []
    fields["command"] = ["bash", "-c", "\n".join([*lines[:-1], *prefix, body])]
    changed.append(
        f"{words[0]}: its {'; '.join(removed)} is what kit's gpu-dmon sidecar does (nvidia-smi dmon into "
        "logs/NODE.gutil on every node where nvidia-smi is, torn down with the job): its text runs in the command "
        "without them (a later change to the file is not seen: convert it again)"
    )


def _without_dmon(text: str) -> tuple[str, list[str]]:
    """``text`` with its background ``nvidia-smi dmon``, the variables holding its pid and every line using them
    as ``:`` (blocks stay whole); such lines at the end are dropped, so the script's status is its command's."""
    removed: list[str] = []
    pids: set[str] = set()
    out: list[tuple[str, bool]] = []  # (text, is a removed line)
    after_dmon = False  # the last command was a dmon started in the background: its $! is the dmon's pid
    for group in shellwords.logical_groups(text):
        joined = shellwords.joined(group).strip()
        if not joined or joined.startswith("#"):
            out.append(("\n".join(group), False))
            continue
        dmon, after_dmon = after_dmon, False
        if DMON.search(joined) and joined.endswith("&"):
            removed.append("nvidia-smi dmon … &")
            after_dmon = True
        elif (m := PID.match(joined)) and dmon:
            pids.add(m.group(1))
            removed.append(f"{m.group(1)}=$!")
        elif pids and any(re.search(rf"\$\{{?{p}\b", joined) for p in pids):
            removed.append(joined)
        else:
            out.append(("\n".join(group), False))
            continue
        indent = group[0][: len(group[0]) - len(group[0].lstrip())]
        out.append((f"{indent}:  # kit convert: kit's gpu-dmon sidecar", True))
    while out and (out[-1][1] or not out[-1][0].strip() or out[-1][0].lstrip().startswith("#")):
        out.pop()
    return "\n".join(t for t, _ in out), removed
