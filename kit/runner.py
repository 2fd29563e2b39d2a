"""The one way kit runs external commands (sbatch, scontrol, slurmd, ...).

Every call logs its argv at debug level and captures the output; the output
is shown to the user only when the command fails.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
from typing import Mapping, Sequence

from kit.errors import KitError

log = logging.getLogger("kit.runner")


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, check: bool = True,
        timeout: float | None = 60, what: str | None = None, hint: str | None = None,
        cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run ``argv``; return the completed process (text output captured).

    With ``check``, a non-zero exit becomes a :class:`KitError` that carries
    the command's output. ``env`` entries are added to this process's
    environment.
    """
    argv = [str(a) for a in argv]
    log.debug("run: %s", shlex.join(argv))
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    try:
        proc = subprocess.run(argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout)
    except FileNotFoundError:
        raise KitError(f"{argv[0]}: command not found", field=what,
                       hint=hint or f"install {argv[0]} or put it on PATH", exit_code=1) from None
    except subprocess.TimeoutExpired:
        raise KitError(f"{shlex.join(argv)} did not finish within {timeout:g} s", field=what,
                       hint=hint, exit_code=1) from None
    if check and proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip()
        raise KitError(f"{argv[0]} failed (exit {proc.returncode}): {shlex.join(argv[1:])}",
                       field=what, detail=output or None, hint=hint, exit_code=1)
    return proc
