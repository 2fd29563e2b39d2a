"""The command a job runs, checked before submission: it must fit what Linux passes to a
process, per-task ``$NAME`` values no shell will expand are pointed out, and Lightning's
``--devices`` must match the tasks per node (it hangs otherwise)."""

from __future__ import annotations

import re
from pathlib import Path

from kit.core.values import ENV_KEY, RESERVED_ENV
from kit.errors import KitError

MAX_ENV_STRING = 32 * 4096  # Linux's limit on one argument or environment string (MAX_ARG_STRLEN), NUL included
MAX_COMMAND_BYTES = 1 << 20
# kit's own variables a job may set with --env (the exporter reads it).
USER_KIT_ENV = frozenset({"KIT_EXPORTER_NAMING"})


def check_exec_sizes(s, origins) -> None:
    """The command and environment must fit what Linux passes to a process."""
    for word in s.command or []:
        if len(word.encode()) + 1 > MAX_ENV_STRING:
            raise KitError(
                f"a command argument is {len(word.encode())} bytes; Linux passes at most "
                f"{MAX_ENV_STRING - 1} bytes per argument",
                field=origins.label("command"),
                hint="put large values in a file and pass its path",
            )
    total = sum(len(w.encode()) + 1 for w in s.command or []) + sum(
        len(k.encode()) + len(v.encode()) + 2 for k, v in s.env.items()
    )
    if total > MAX_COMMAND_BYTES:
        raise KitError(
            f"the command and --env values come to {total} bytes; kit allows {MAX_COMMAND_BYTES} "
            "(Linux's limit for one process, less what Slurm and kit add)",
            field=origins.label("command"),
            hint="put large values in a file and pass its path",
        )


SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})
# What differs from task to task: a `$NAME` of one of these in an argument is a per-task value the user
# expects a shell to fill in.
PER_TASK_VARIABLES = RESERVED_ENV | {"MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "HOSTNAME", "CUDA_VISIBLE_DEVICES"}
_DOLLAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def literal_task_variables(command: list[str]) -> list[str]:
    """Warnings for ``$NAME`` of a per-task variable in an argument of a command no shell
    runs: kit passes arguments as they are (no shell expands them on the nodes)."""
    if not command or Path(command[0]).name in SHELLS:
        return []
    out = []
    for arg in command[1:]:
        names = [n for n in _DOLLAR.findall(arg) if n in PER_TASK_VARIABLES or n.startswith(("SLURM_", "PMI_"))]
        if names:
            out.append(
                f"the argument {arg!r} reaches {Path(command[0]).name} as written: no shell expands "
                f"${names[0]} (kit runs the command without one); for a per-task value write "
                f"-- bash -c '{command[0]} ... {arg} ...'"
            )
    return out


def restarts_blind(s, origins) -> list[str]:
    """The warning for ``--on-failure restart`` of a command that may report no checkpoint step: the stall rule
    (two runs in a row without a new checkpoint: exit 76) can only see a step reported, so such a command is
    restarted on every failure until the budget is spent (docs/endings.md). The reference trainer reports one."""
    if s.on_failure != "restart" or not s.max_restarts or "kit.train" in s.command[:3]:
        return []
    return [
        f"{origins.label('on_failure')} restart: a command that reports no checkpoint step (progress."
        f"checkpoint_saved, or $KIT_CHECKPOINT_STEP_FILE: docs/hangs.md) is restarted after every failure until "
        f"its {s.max_restarts} restarts are spent, however often it fails the same way; one that reports it is "
        "stopped after two runs in a row without a new checkpoint (exit 76)"
    ]


def check_devices(s, origins) -> None:
    """Lightning hangs at "Initializing distributed" when devices != tasks per node."""
    cmd = s.command or []
    for i, arg in enumerate(cmd):
        for flag in ("--devices", "--trainer.devices"):
            value = None
            if arg == flag and i + 1 < len(cmd):
                value = cmd[i + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
            if value is not None and value.isdigit() and int(value) != s.ntasks_per_node:
                raise KitError(
                    f"the command asks for {flag} {value} but each node runs {s.ntasks_per_node} task(s)",
                    field=origins.label("command"),
                    hint=f"use --ntasks-per-node {value}, or {flag} {s.ntasks_per_node}: "
                    "Lightning hangs at 'Initializing distributed' when they differ",
                )


def check_env(s, origins) -> None:
    """Each --env variable: a name a shell can set, not one kit or Slurm sets, its value within Linux's limit."""
    for key, value in s.env.items():
        if len(key.encode()) + 1 + len(value.encode()) >= MAX_ENV_STRING:
            raise KitError(
                f"{key}: the value is {len(value.encode())} bytes; Linux passes at most "
                f"{MAX_ENV_STRING - 1} bytes per variable (KEY=VALUE) to a process",
                field=origins.label("env"),
                hint="put large values in a file and pass its path",
            )
        if not ENV_KEY.match(key):
            raise KitError(
                f"not a variable name: {key!r}",
                field=origins.label("env"),
                hint="names are letters, digits and _, not starting with a digit",
            )
        if key in RESERVED_ENV:
            raise KitError(
                f"{key} is set by the launcher from Slurm's variables",
                field=origins.label("env"),
                hint="leave it out; kit maps SLURM_PROCID etc. to " + ", ".join(sorted(RESERVED_ENV)),
            )
        if key == "CUDA_VISIBLE_DEVICES" and s.gpus_per_node:
            raise KitError(
                f"{key}: Slurm binds each task's {s.gpus_per_node} GPU(s) and sets it itself, replacing this value",
                field=origins.label("env"),
                hint="leave it out: --gpus-per-node chooses how many GPUs each node's tasks get",
            )
        if key.startswith(("KIT_", "SLURM_")) and key not in USER_KIT_ENV:
            raise KitError(f"{key}: names starting with KIT_ or SLURM_ are reserved", field=origins.label("env"))
