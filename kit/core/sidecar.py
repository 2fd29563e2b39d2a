"""A job's sidecars by name: ``--sidecar 'NAME: COMMAND'`` names one (its log: ``logs/<node>.r<run>.NAME.log``),
else it is ``hook<N>``; two of one name, or a name its log cannot carry, are refused."""

from __future__ import annotations

import re

from kit.errors import KitError

SIDECAR_NAME = re.compile(r"([A-Za-z][A-Za-z0-9_-]{0,31}): (.*)", re.S)
BUILTIN_SIDECARS = ("exporter", "gpu-dmon")


def sidecar_name(command: str, index: int) -> tuple[str, str]:
    """(name, command) of a ``--sidecar``: ``NAME: COMMAND`` names it (logs/<node>.r<run>.NAME.log), else ``hook<index>``."""
    m = SIDECAR_NAME.fullmatch(command)
    return (m.group(1), m.group(2)) if m else (f"hook{index}", command)


def check_sidecars(s, origins) -> None:
    """The job's ``--sidecar`` commands: each a name of its own (kit's are taken), each with a command."""
    seen, field = set(BUILTIN_SIDECARS), origins.label("sidecars")
    for i, text in enumerate(s.sidecars, 1):
        name, rest = sidecar_name(text, i)
        if (meant := re.match(r"([^\s:]+): ", text)) and name == f"hook{i}":  # a NAME its log cannot carry
            raise KitError(
                f"sidecar name {meant.group(1)!r} is not a name",
                field=field,
                hint="a letter, then up to 31 letters, digits, _ or - (NAME: COMMAND)",
            )
        if name in seen:
            raise KitError(
                f"two sidecars named {name!r}",
                field=field,
                hint="give each its own name (NAME: COMMAND); " + ", ".join(BUILTIN_SIDECARS) + " are kit's",
            )
        if not rest.strip():
            raise KitError(f"sidecar {name!r} has no command", field=field)
        seen.add(name)
