""".dockerignore: which files of the build context COPY and ADD leave out.

As Docker reads it: one pattern a line, ``#`` comments, paths relative to the
context (a leading ``/`` is dropped), ``*``, ``?`` and ``[...]`` within one
path element, ``**`` for any number of elements, ``!`` to take a path back;
the last matching line wins. A pattern that matches a directory excludes
everything under it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


def _regex(pattern: str) -> re.Pattern:
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern[i : i + 1] == "/":
                i += 1
                out.append("(?:.*/)?")
            else:
                out.append(".*")
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end].replace("\\", "\\\\")
                if body.startswith("!") or body.startswith("^"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    # A match of a directory covers everything under it.
    return re.compile("".join(out) + "(?:/.*)?")


def _clean(pattern: str) -> str:
    parts = [p for p in pattern.strip().split("/") if p not in ("", ".")]
    return "/".join(parts)


@dataclass(frozen=True)
class Ignore:
    patterns: list[str]  # as written (without comments and blank lines), for the build digest

    def excluded(self, relpath: str) -> bool:
        """True when ``relpath`` (relative to the context, / separated) is left out."""
        verdict = False
        for pattern in self.patterns:
            keep = pattern.startswith("!")
            body = _clean(pattern[1:] if keep else pattern)
            if body and _regex(body).fullmatch(relpath):
                verdict = not keep
        return verdict

    def descend(self, relpath: str) -> bool:
        """True when an exception (``!`` line) may take back something under the directory
        ``relpath``: Docker then walks into an excluded directory (``sub`` + ``!sub/keep``)."""
        parts = relpath.split("/")
        for pattern in self.patterns:
            if not pattern.startswith("!"):
                continue
            body = _clean(pattern[1:]).split("/")
            for i, part in enumerate(parts):
                if i >= len(body) or body[i] == "**":
                    return True
                if not _regex(body[i]).fullmatch(part):
                    break
            else:
                if len(body) > len(parts):
                    return True
        return False

    def skips(self, relpath: str, is_dir: bool) -> bool:
        """Whether a copy leaves ``relpath`` out: excluded, and (for a directory) nothing under it taken back."""
        return self.excluded(relpath) and not (is_dir and self.descend(relpath))


def load(context: Path) -> Ignore:
    path = context / ".dockerignore"
    if not path.is_file():
        return Ignore([])
    text = path.read_text(encoding="utf-8", errors="replace").removeprefix("\ufeff")
    lines = [line.strip() for line in text.splitlines()]
    return Ignore([line for line in lines if line and not line.startswith("#")])
