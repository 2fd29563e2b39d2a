"""Text as a terminal shows it: whatever another user, a job or a tracker wrote (a job name, a run id)
is shown with its control characters as escapes, never acted on by the terminal."""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with control characters and lone surrogates escaped (``\\x1b``): a value from another
    user's file must not clear or retitle the terminal of whoever lists it, and a listed line stays one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
