"""One value of a job spec, parsed and checked: a memory size, a time limit, a port range,
a warning signal, a ``KEY=VALUE``, an ``--after`` item, and which sbatch options kit owns.
Each error is a :class:`~kit.errors.KitError` without a field: the caller names it."""

from __future__ import annotations

import re

from kit.errors import KitError

# Variables the launcher owns: a user value would be overwritten or would
# break the rank mapping, so --env refuses them.
RESERVED_ENV = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
    }
)

# sbatch options kit sets itself from its own fields.
OWNED_SBATCH = {
    "--nodes": "--nodes",
    "-N": "--nodes",
    "--ntasks-per-node": "--ntasks-per-node",
    "--gpus-per-node": "--gpus-per-node",
    "--cpus-per-task": "--cpus-per-task",
    "-c": "--cpus-per-task",
    "--mem": "--mem",
    "--time": "--time",
    "-t": "--time",
    "--partition": "--partition",
    "-p": "--partition",
    "--account": "--account",
    "-A": "--account",
    "--job-name": "--job-name",
    "-J": "--job-name",
    "--output": "--output-dir",
    "-o": "--output-dir",
    "--error": "--output-dir",
    "-e": "--output-dir",
    "--array": "--array",
    "-a": "--array",
    "--dependency": "--after",
    "-d": "--after",
    "--kill-on-invalid-dep": "--after",
    "--signal": "--signal",
    "--requeue": "--max-restarts",
    "--no-requeue": "--max-restarts",
    "--open-mode": "it appends to the logs",
    "--parsable": "--json",
    "--wait": "--wait",
    "-W": "--wait",
    "--ntasks": "--ntasks-per-node",
    "-n": "--ntasks-per-node",
    "--wrap": "the command after -- (kit writes the batch script)",
    "--chdir": "the directory kit launch runs in (or its code snapshot's view)",
    "-D": "the directory kit launch runs in (or its code snapshot's view)",
}
# sbatch's short options that take no value (the letters after them are more options).
_SBATCH_FLAGS = frozenset("hHkOQsuvV")
# sbatch's own long options that are prefixes of ones kit owns.
_SBATCH_EXACT = frozenset({"--gpus"})


def owned_sbatch_option(arg: str) -> str | None:
    """The option kit owns that ``arg`` sets, the way sbatch's getopt reads it, or None.

    Short options may carry their value (``-N3``, ``-o/path``) or follow
    value-less flags (``-vN3``); long options may be abbreviated to any
    unique prefix (``--outp=x``, ``--no-requeu``).
    """
    if arg.startswith("--"):
        name = arg.split("=", 1)[0]
        if name in OWNED_SBATCH:
            return name
        if name in _SBATCH_EXACT or len(name) < 3:
            return None
        return next((o for o in OWNED_SBATCH if o.startswith("--") and o.startswith(name)), None)
    for letter in arg[1:]:
        if f"-{letter}" in OWNED_SBATCH:
            return f"-{letter}"
        if letter not in _SBATCH_FLAGS:
            return None
    return None


WARNING_SIGNALS = ("USR1", "USR2")  # TERM and INT already mean "stop now"

ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MEM = re.compile(r"([0-9]+)([KMGT]?)\Z", re.IGNORECASE)
_PORT_RANGE = re.compile(r"([0-9]+)-([0-9]+)\Z")


def parse_mem(value: str) -> str:
    """Slurm --mem: a whole number with an optional K/M/G/T suffix (default MB)."""
    m = _MEM.match(value.strip())
    if not m or int(m.group(1)) == 0:
        raise KitError(
            f"not a memory size: {value!r}",
            hint="use a whole number with an optional unit K, M, G or T, e.g. 64G or 16000 (MB)",
        )
    return m.group(1) + m.group(2).upper()


def parse_time(value: str) -> int:
    """Slurm --time formats to seconds: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    text = value.strip()
    hint = "use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. 30 or 2:00:00 or 1-12:00:00"
    if not re.fullmatch(r"[0-9]+(-[0-9]+)?(:[0-9]+){0,2}", text):
        raise KitError(f"not a time limit: {value!r}", hint=hint)
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
        parts = [int(p) for p in text.split(":")]
        parts += [0] * (3 - len(parts))
        h, m, s = parts
    else:
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        else:
            h, m, s = parts
    if (m >= 60 and (days or len(parts) == 3)) or s >= 60 or (days and h >= 24):
        raise KitError(f"not a time limit: {value!r} (a field is out of range)", hint=hint)
    total = ((days * 24 + h) * 60 + m) * 60 + s
    if total == 0:
        raise KitError(f"time limit must be more than zero, got {value!r}", hint=hint)
    return total


def parse_port_range(value: str) -> tuple[int, int]:
    m = _PORT_RANGE.match(value.strip())
    if not m or not (1024 <= int(m.group(1)) <= int(m.group(2)) <= 65535):
        raise KitError(f"not a port range: {value!r}", hint="use LOW-HIGH within 1024-65535, e.g. 29500-30499")
    return int(m.group(1)), int(m.group(2))


def parse_env_item(item: str) -> tuple[str, str]:
    """``KEY=VALUE`` from --env."""
    if "=" not in item:
        raise KitError(f"expected KEY=VALUE, got {item!r}", hint=f"write --env {item}=VALUE")
    key, value = item.split("=", 1)
    return key, value


def parse_signal(value: str) -> str:
    name = value.strip().upper()
    name = name[3:] if name.startswith("SIG") else name
    if name not in WARNING_SIGNALS:
        raise KitError(f"not a warning signal: {value!r}", hint="choose one of " + ", ".join(WARNING_SIGNALS))
    return name


ACTIONS = {
    "on_straggler": ("tell", "requeue", "restart"),  # --on-straggler
    "on_failure": ("stop", "restart"),  # --on-failure
}


def parse_action(field: str, value: str) -> str:
    """``value`` when it is one of ``ACTIONS[field]``."""
    if value not in ACTIONS[field]:
        raise KitError(f"not an action: {value!r}", hint="choose one of " + ", ".join(ACTIONS[field]))
    return value


AFTER_KINDS = ("ok", "any", "notok")


def parse_after(item: str, label: str) -> tuple[str, str]:
    """``JOB[:ok|any|notok]`` -> (JOB, kind); JOB is a job id or a job directory."""
    job, sep, kind = item.rpartition(":")
    if not sep or kind not in AFTER_KINDS:
        job, kind = item, "ok"
    if not job or "\n" in job:
        raise KitError(
            f"expected JOB[:ok|any|notok], got {item!r}",
            field=label,
            hint="e.g. --after 1234 (after it succeeded), --after 1234:any, --after kit-jobs/train-...:ok",
        )
    return job, kind
