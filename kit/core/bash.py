"""Writing values into bash: the one quoting function, and the scripts kit ships.

Every user-supplied value that reaches a job's bash goes through :func:`quote` (a word) or :func:`array` (a list of
words), into the job's ``job.env``; the scripts themselves (``launch/``) are copied as they ship (:func:`template`).
"""

from __future__ import annotations

import functools
import importlib.util
import shlex
from pathlib import Path
from typing import Iterable, Mapping


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


def checkout() -> Path | None:
    """The source checkout this ``kit`` was imported from (its pyproject.toml beside the package), if it was: its
    ``launch/`` and ``monitoring/`` are this kit's, whatever an editable install elsewhere maps ``kit.templates`` to
    (a second checkout run with PYTHONPATH, as a git worktree's tests are, got the first one's scripts)."""
    root = Path(__file__).resolve().parent.parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "launch" / "__init__.py").is_file() else None


@functools.cache
def templates_dir() -> Path:
    """Where the job's scripts are: ``launch/`` in the checkout kit was imported from, else the package's
    ``kit.templates`` (kit installed), else ``launch/`` beside the package."""
    if (root := checkout()) is not None:
        return root / "launch"
    try:  # (find_spec, not importlib.resources: its readers cost every kit launch a zipfile import)
        found = importlib.util.find_spec("kit.templates")
    except ModuleNotFoundError:
        found = None
    if found is None or not found.submodule_search_locations:
        return Path(__file__).resolve().parent.parent.parent / "launch"
    return Path(next(iter(found.submodule_search_locations)))


def template(name: str) -> str:
    """The text of a script shipped in the package (``launch/`` in the source tree)."""
    return (templates_dir() / name).read_text(encoding="utf-8")
