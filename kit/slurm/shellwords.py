"""Shell text as bash reads it, for `kit convert`: logical lines, the words of a line and where they are,
what makes a line more than words, and words written back so that bash reads them the same."""

from __future__ import annotations

import re
import shlex


def logical_groups(text: str) -> list[list[str]]:
    """The script's physical lines, grouped into its logical lines (a backslash continuation joins the next)."""
    out, current = [], []
    for raw in text.splitlines():
        current.append(raw)
        if not _continued(raw):
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def joined(group: list[str]) -> str:
    """One logical line's text: its physical lines with the continuations joined."""
    return "".join(raw.rstrip()[:-1] + " " if _continued(raw) else raw for raw in group)


def logical_lines(text: str) -> list[str]:
    """The script's lines with backslash continuations joined."""
    return [joined(group) for group in logical_groups(text)]


def _continued(raw: str) -> bool:
    return raw.rstrip().endswith("\\") and not raw.lstrip().startswith("#")


def shell_syntax(line: str) -> str | None:
    """What makes ``line`` more than words for a shell (outside quotes), if anything."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError:
        return "unbalanced quotes"
    operators = sorted({t for t in tokens if t and all(ch in "();<>|&" for ch in t)})
    if operators:
        return ", ".join(f"'{op}'" for op in operators)
    unquoted = re.sub(r"'[^']*'", "", line)
    if "`" in unquoted:
        return "backticks"
    if "$(" in unquoted:
        return "$(...)"
    return None


def spans(line: str) -> list[tuple[int, int]]:
    """Where each word of ``line`` is, as the shell splits it (quotes kept with their word)."""
    out, i, quote = [], 0, None
    while i < len(line):
        while i < len(line) and line[i] in " \t":
            i += 1
        if i >= len(line):
            break
        start = i
        while i < len(line):
            ch = line[i]
            if quote:
                if ch == quote:
                    quote = None
                elif ch == "\\" and quote == '"':
                    i += 1
            elif ch in "'\"":
                quote = ch
            elif ch == "\\":
                i += 1
            elif ch in " \t":
                break
            i += 1
        out.append((start, min(i, len(line))))
    return out


def after_words(line: str, n: int) -> str:
    """``line`` from its ``n``-th word on (words as the shell splits them, quotes respected)."""
    found = spans(line)
    return line[found[n][0] :].strip() if n < len(found) else ""


def shell_words(words: list[str]) -> str:
    """``words`` as one bash command line in which ``$VARIABLES`` still expand (double quotes)."""
    out = []
    for w in words:
        if re.fullmatch(r"[A-Za-z0-9_@%+=:,./${}-]+", w):
            out.append(w)
        else:
            out.append('"' + w.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"')
    return " ".join(out)


def names(text: str) -> set[str]:
    return set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text))


def double_quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'
