"""Text as a terminal shows it: whatever another user, a job or a tracker wrote (a job name, a run id)
is shown with its control characters as escapes, never acted on by the terminal."""

from __future__ import annotations

import re
import sys


def printable(text: str) -> str:
    """``text`` with control characters and lone surrogates escaped (``\\x1b``): a value from another
    user's file must not clear or retitle the terminal of whoever lists it, and a listed line stays one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


# C0 controls but tab, newline and carriage return (a progress bar's), DEL, and C1 controls as UTF-8 encodes them
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\xc2[\x80-\x9f]")


def for_terminal(data: bytes, carry: bytes = b"") -> tuple[bytes, bytes]:
    """Bytes another machine sent, as a terminal may show them: escape sequences (a title, the clipboard, a
    hyperlink) written as ``\\x1b`` and never acted on; lines, tabs, carriage returns and text as they came.
    ``carry``: the previous chunk's unfinished end (a UTF-8 lead byte); returns (what to show, the next carry)."""
    data = carry + data
    carry = data[-1:] if data.endswith(b"\xc2") else b""
    data = data[: len(data) - len(carry)]
    return _CONTROL.sub(lambda m: "".join(f"\\x{b:02x}" for b in m.group()).encode(), data), carry


class Shown:
    """What another machine sends (a login node), written to ``stream`` (a binary one; ours by default):
    escaped where it is a terminal (:func:`for_terminal`: a hostile login node's escape sequences are shown,
    never acted on), bytes as they came where it is a file or a pipe."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout.buffer
        self.tty, self.carry = self.stream.isatty(), b""

    def __call__(self, data: bytes) -> None:
        if self.tty:
            data, self.carry = for_terminal(data, self.carry)
        self.stream.write(data)
        self.stream.flush()
