"""The one way kit runs external commands (sbatch, scontrol, slurmd, ...).

Every call logs its argv at debug level and captures the output; the output
is shown to the user only when the command fails.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from typing import Mapping, Sequence

from kit.errors import KitError

VERBOSE = False  # `kit -v`: every external command said on stderr before it runs (the command line sets it)

_TIED = False


def tie_children() -> None:
    """From now on every command this process starts is killed (SIGKILL) when this
    process dies, however it dies (``PR_SET_PDEATHSIG``): a killed ``kit build``
    leaves no mksquashfs, pip or build step running. For commands whose work is
    this process's alone; call it from the main thread."""
    global _TIED
    _TIED = True


def _die_with_parent() -> None:
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def preexec():
    """The ``preexec_fn`` for subprocess calls outside :func:`run` (None unless :func:`tie_children`)."""
    return _die_with_parent if _TIED else None


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float | None = 60,
    what: str | None = None,
    hint: str | None = None,
    cwd: str | None = None,
    stream: bool = False,
    exit_code: int = 1,
) -> subprocess.CompletedProcess:
    """Run ``argv``; return the completed process (text output captured).

    With ``check``, a non-zero exit becomes a :class:`KitError` (with
    ``exit_code``) that carries the command's output. ``env`` entries are
    added to this process's environment. With ``stream`` the output goes to
    this process's stderr as it comes (progress bars) instead of being captured.
    """
    argv = [str(a) for a in argv]
    if VERBOSE:
        print(f"kit: kit.runner: run: {shlex.join(argv)}", file=sys.stderr, flush=True)
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    try:
        out = None if stream else subprocess.PIPE
        proc = subprocess.run(
            argv,
            env=full_env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=2 if stream else out,
            stderr=out,
            text=True,
            timeout=timeout,
            preexec_fn=preexec(),
        )
    except FileNotFoundError:
        raise KitError(
            f"{argv[0]}: command not found",
            field=what,
            hint=hint or f"install {argv[0]} or put it on PATH",
            exit_code=1,
        ) from None
    except subprocess.TimeoutExpired:
        raise KitError(
            f"{shlex.join(argv)} did not finish within {timeout:g} s", field=what, hint=hint, exit_code=1
        ) from None
    if check and proc.returncode != 0:
        output = ((proc.stdout or "") + (proc.stderr or "")).strip()
        raise KitError(
            f"{argv[0]} failed (exit {proc.returncode}): {shlex.join(argv[1:])}",
            field=what,
            detail=tail(output) or None,
            hint=hint,
            exit_code=exit_code,
        )
    return proc


def tail(text: str, lines: int = 30) -> str:
    """The last ``lines`` lines of ``text`` (what a failure shows)."""
    parts = text.splitlines()
    if len(parts) <= lines:
        return text
    return "\n".join([f"... ({len(parts) - lines} earlier lines)", *parts[-lines:]])
