"""A Dockerfile's text into instructions, read as Docker's reference describes: parser
directives (``# syntax=``, ``# escape=``), comments, line continuations, ``RUN`` heredocs;
and the words inside an instruction: shell and exec forms, ``--flags``, ``KEY=VALUE`` pairs,
``$VAR``/``${VAR:-default}`` substitution. Every error names the file and line."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from kit.errors import KitError

# Accepted, with a one-line notice: they mean nothing to an enroot image.
IGNORED = ("EXPOSE", "HEALTHCHECK", "STOPSIGNAL", "ONBUILD", "MAINTAINER")
KNOWN = (
    "FROM",
    "RUN",
    "COPY",
    "ADD",
    "ENV",
    "ARG",
    "WORKDIR",
    "LABEL",
    "ENTRYPOINT",
    "CMD",
    "VOLUME",
    "USER",
    "SHELL",
    "KIT",
    *IGNORED,
)
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Instruction:
    line: int
    keyword: str
    text: str  # the arguments, continuation lines joined
    heredocs: list[tuple[str, str]] = field(default_factory=list)  # (delimiter, body)


def error(label: str, line: int, message: str, hint: str | None = None) -> KitError:
    return KitError(message, field=f"{label}:{line}", hint=hint)


def parse(text: str, label: str) -> list[Instruction]:
    """Instructions of a Dockerfile, with their first line numbers."""
    lines = text.splitlines()
    escape = "\\"
    i = 0
    # Parser directives: comments at the very top, before anything else.
    while i < len(lines):
        m = re.fullmatch(r"#\s*([A-Za-z]+)\s*=\s*(\S*)\s*", lines[i])
        if not m:
            break
        key, value = m.group(1).lower(), m.group(2)
        if key == "escape":
            if value not in ("\\", "`"):
                raise error(label, i + 1, f"escape must be \\ or `, got {value!r}")
            escape = value
        i += 1
    out: list[Instruction] = []
    while i < len(lines):
        raw = lines[i]
        start = i + 1
        i += 1
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        parts = [raw]
        while parts[-1].rstrip().endswith(escape):
            parts[-1] = parts[-1].rstrip()[:-1]
            # Comment lines and empty lines inside a continuation are dropped.
            while i < len(lines) and (lines[i].lstrip().startswith("#") or not lines[i].strip()):
                i += 1
            if i >= len(lines):
                break
            parts.append(lines[i])
            i += 1
        joined = " ".join(p.strip() for p in parts)
        keyword, _, rest = joined.partition(" ")
        keyword = keyword.upper()
        if keyword not in KNOWN:
            raise error(
                label,
                start,
                f"unknown instruction {keyword}",
                hint="kit builds from FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, LABEL, ENTRYPOINT, CMD, "
                "VOLUME, USER, SHELL and its own KIT",
            )
        heredocs = []
        for m in re.finditer(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2", rest):
            strip, delimiter = m.group(1) == "-", m.group(3)
            body = []
            while i < len(lines) and (lines[i].lstrip("\t") if strip else lines[i]) != delimiter:
                body.append(lines[i].lstrip("\t") if strip else lines[i])
                i += 1
            if i >= len(lines):
                raise error(label, start, f"heredoc <<{delimiter} is not closed")
            i += 1
            heredocs.append((delimiter, "\n".join(body) + "\n"))
        out.append(Instruction(start, keyword, rest.strip(), heredocs))
    return out


def substitute(text: str, env: dict[str, str], label: str, line: int) -> str:
    """$VAR, ${VAR}, ${VAR:-default} and ${VAR:+alternative} from ARG and ENV values; \\$ is a literal $."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and text[i + 1 : i + 2] == "$":
            out.append("$")
            i += 2
            continue
        if c != "$":
            out.append(c)
            i += 1
            continue
        m = NAME.match(text, i + 1)
        if m:
            out.append(env.get(m.group(), ""))
            i = m.end()
            continue
        m = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:(:[-+])([^}]*))?\}").match(text, i + 1)
        if not m:
            if text[i + 1 : i + 2] == "{":
                raise error(
                    label,
                    line,
                    f"unsupported substitution {text[i : i + 20]}...",
                    hint="use ${VAR}, ${VAR:-default} or ${VAR:+alternative}",
                )
            out.append(c)
            i += 1
            continue
        value = env.get(m.group(1), "")
        if m.group(2) == ":-":
            value = value or m.group(3)
        elif m.group(2) == ":+":
            value = m.group(3) if value else ""
        out.append(value)
        i = m.end()
    return "".join(out)


def words(text: str, label: str, line: int) -> list[str]:
    """Whitespace-split words, honouring double and single quotes."""
    try:
        return shlex.split(text, posix=True)
    except ValueError as e:
        raise error(label, line, f"cannot split the arguments: {e}") from None


def exec_form(text: str) -> list[str] | None:
    """A JSON array of strings, or None (the shell form)."""
    if not text.startswith("["):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def flags(text: str, allowed: tuple[str, ...], label: str, line: int) -> tuple[dict[str, str], str]:
    given = {}
    while text.startswith("--"):
        word, _, text = text.partition(" ")
        key, sep, value = word[2:].partition("=")
        if key not in allowed:
            raise error(
                label,
                line,
                f"unsupported flag --{key}",
                hint=("accepted here: " + ", ".join(f"--{a}" for a in allowed)) if allowed else None,
            )
        if not sep:
            raise error(label, line, f"--{key} needs a value (--{key}=VALUE)")
        given[key] = value
        text = text.lstrip()
    return given, text


def pairs(text: str, label: str, line: int, what: str) -> dict[str, str]:
    """KEY=VALUE pairs (quotes allowed), or the legacy `KEY VALUE` form."""
    found = words(text, label, line)
    if found and "=" not in found[0]:
        if len(found) < 2:
            raise error(label, line, f"{what} needs KEY=VALUE")
        return {found[0]: text.split(None, 1)[1].strip().strip('"')}
    out = {}
    for w in found:
        key, sep, value = w.partition("=")
        if not sep or not key:
            raise error(label, line, f"{what}: expected KEY=VALUE, got {w!r}")
        out[key] = value
    return out
