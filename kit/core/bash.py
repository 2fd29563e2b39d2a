"""Writing values into generated bash: the one quoting function and the template filler.

Every user-supplied value that reaches a generated script goes through
:func:`quote` (a word) or :func:`array` (a list of words). Templates are
plain bash files with ``{{ name }}`` slots; :func:`render` fills them with
snippets that are already quoted and refuses a slot it was not given.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path
from typing import Iterable, Mapping

_SLOT = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")


def quote(value: object) -> str:
    """One bash word whose value is exactly ``str(value)``.

    Words with a comma are quoted too, though bash would not need it, so a
    comma inside an array element does not read as a separator (shellcheck SC2054).
    """
    text = str(value)
    quoted = shlex.quote(text)
    if quoted == text and "," in text:
        return f"'{text}'"
    return quoted


def array(values: Iterable[object]) -> str:
    """The inside of a bash array literal: ``( {array(...)} )``."""
    return " ".join(quote(v) for v in values)


def exports(env: Mapping[str, str]) -> str:
    """``export K=V`` lines, sorted so output is deterministic. Keys must be valid names."""
    return "\n".join(f"export {k}={quote(v)}" for k, v in sorted(env.items()))


def templates_dir() -> Path:
    """Where the generated scripts' templates are: the package's ``kit.templates`` once kit is installed,
    else ``launch/`` beside the package (a checkout run without installing, as a bench copied to a GPU box)."""
    try:  # (find_spec, not importlib.resources: its readers cost every kit launch a zipfile import)
        found = importlib.util.find_spec("kit.templates")
    except ModuleNotFoundError:
        found = None
    if found is None or not found.submodule_search_locations:
        return Path(__file__).resolve().parent.parent.parent / "launch"
    return Path(next(iter(found.submodule_search_locations)))


def template(name: str) -> str:
    """The text of a template shipped in the package (``launch/`` in the source tree)."""
    return (templates_dir() / name).read_text(encoding="utf-8")


def render(text: str, values: Mapping[str, str]) -> str:
    """Fill ``{{ slot }}``s; every slot must be given and every value used."""
    used: set[str] = set()

    def fill(m: re.Match) -> str:
        name = m.group(1)
        if name not in values:
            raise KeyError(f"template slot {name!r} has no value")
        used.add(name)
        return values[name]

    out = _SLOT.sub(fill, text)
    unused = set(values) - used
    if unused:
        raise KeyError(f"values given for no slot: {sorted(unused)}")
    return out
