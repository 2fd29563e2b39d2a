"""The job spec: what a user asks for, validated before anything is written.

A :class:`JobSpec` comes from a TOML job file and command-line options (the
command line wins). ``None`` means "not given". :func:`resolve` validates it
and fills defaults; every problem is a :class:`~kit.errors.KitError` whose
field is spelled the way the user gave it (``--nodes`` or ``job.toml: nodes``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kit import files
from kit.core import options
from kit.core import sweep as sweep_lib
from kit.errors import KitError



def _to_dict(self) -> dict[str, Any]:
    return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


# Everything that describes one job, a field per option of kit.core.options (the one
# declaration of each). ``None``: not given (a default applies).
JobSpec = dataclasses.make_dataclass(
    "JobSpec", [(o.name, o.python_type | None, field(default=None)) for o in options.SPEC_OPTIONS],
    namespace={"to_dict": _to_dict, "__doc__": "Everything that describes one job (kit.core.options). "
                                               "``None``: not given (a default applies).",
               "__module__": __name__})

FIELD_NAMES = tuple(o.name for o in options.SPEC_OPTIONS)
DEFAULTS: dict[str, Any] = {o.name: o.default for o in options.SPEC_OPTIONS if o.default is not None}

# Variables the launcher owns: a user value would be overwritten or would
# break the rank mapping, so --env refuses them.
RESERVED_ENV = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
})
MAX_INT = 2 ** 31 - 1  # counts and seconds: what Slurm's fields and bash arithmetic hold
MAX_JOB_NAME = 200
# Linux's limit on one argument or environment string (MAX_ARG_STRLEN), NUL included.
MAX_ENV_STRING = 32 * 4096
# kit's own variables a job may set with --env (the exporter reads it).
USER_KIT_ENV = frozenset({"KIT_EXPORTER_NAMING"})
# sbatch options kit sets itself from its own fields.
OWNED_SBATCH = {
    "--nodes": "--nodes", "-N": "--nodes", "--ntasks-per-node": "--ntasks-per-node",
    "--gpus-per-node": "--gpus-per-node", "--cpus-per-task": "--cpus-per-task", "-c": "--cpus-per-task",
    "--mem": "--mem", "--time": "--time", "-t": "--time", "--partition": "--partition",
    "-p": "--partition", "--account": "--account", "-A": "--account", "--job-name": "--job-name",
    "-J": "--job-name", "--output": "--output-dir", "-o": "--output-dir", "--error": "--output-dir",
    "-e": "--output-dir", "--array": "--array", "-a": "--array", "--dependency": "--after", "-d": "--after",
    "--kill-on-invalid-dep": "--after", "--signal": "--signal", "--requeue": "--max-restarts",
    "--no-requeue": "--max-restarts", "--open-mode": "(kit appends to logs)", "--parsable": "--json",
    "--wait": "--wait", "-W": "--wait", "--ntasks": "--ntasks-per-node", "-n": "--ntasks-per-node",
    "--wrap": "the command after -- (kit writes the batch script)",
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

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MEM = re.compile(r"([0-9]+)([KMGT]?)\Z", re.IGNORECASE)
_PORT_RANGE = re.compile(r"([0-9]+)-([0-9]+)\Z")


class Origins(dict):
    """Maps a field name to the label the user knows it by."""

    def label(self, name: str) -> str:
        return self.get(name) or cli_label(name)


def cli_label(name: str) -> str:
    """How the command line spells a field: ``--gpus-per-node``, ``--sbatch-arg``."""
    option = options.BY_NAME.get(name)
    return option.label if option else "--" + name.replace("_", "-")


# ---------------------------------------------------------------- parsing
def parse_mem(value: str) -> str:
    """Slurm --mem: a whole number with an optional K/M/G/T suffix (default MB)."""
    m = _MEM.match(value.strip())
    if not m or int(m.group(1)) == 0:
        raise KitError(f"not a memory size: {value!r}",
                       hint="use a whole number with an optional unit K, M, G or T, e.g. 64G or 16000 (MB)")
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


# ---------------------------------------------------------------- job files
JOB_FILE_LIMIT = 4 << 20  # a job file is a few lines; /dev/zero is not one


def load_job_file(path: str | Path) -> tuple[JobSpec, Origins]:
    """Read a TOML job file: top-level keys are JobSpec fields (dashes or underscores)."""
    p = Path(path)
    label = str(path)
    try:
        data = files.read_toml(p, JOB_FILE_LIMIT)
    except FileNotFoundError:
        raise KitError(f"no such job file: {path}", field="--job-file",
                       hint="give the path of a TOML job file (see README: job files)") from None
    except OSError as e:
        raise KitError(f"cannot read {path}: {e.strerror}", field="--job-file") from None
    except ValueError as e:
        raise KitError(f"not valid TOML: {e}", field=label,
                       hint="fix the file; TOML strings need quotes, e.g. time = \"1:00:00\"") from None
    spec = JobSpec()
    origins = Origins()
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in FIELD_NAMES:
            raise KitError(f"unknown key {key!r}", field=label,
                           hint="valid keys: " + ", ".join(n.replace("_", "-") for n in FIELD_NAMES))
        setattr(spec, name, _coerce_file_value(name, value, f"{label}: {key}"))
        origins[name] = f"{label}: {key}"
    return spec, origins


_KINDS = {o.name: o.kind for o in options.SPEC_OPTIONS}
_INT_FIELDS = {n for n, k in _KINDS.items() if k == options.INT}
_STR_FIELDS = {n for n, k in _KINDS.items() if k == options.STR}
_LIST_FIELDS = {n for n, k in _KINDS.items() if k == options.LIST}
_BOOL_FIELDS = {n for n, k in _KINDS.items() if k in options.BOOLS}


def _coerce_file_value(name: str, value: Any, label: str) -> Any:
    def bad(kind: str, example: str) -> KitError:
        return KitError(f"expected {kind}, got {type(value).__name__} {value!r}", field=label,
                        hint=f"write it as {example}")
    if name in _INT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("a whole number", f"{name.replace('_', '-')} = 2")
        return value
    if name in _STR_FIELDS:
        if name == "mem" and isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if name == "time" and isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise bad("a string", f'{name.replace("_", "-")} = "..."')
        return value
    if name in _BOOL_FIELDS:
        if not isinstance(value, bool):
            raise bad("true or false", f"{name.replace('_', '-')} = true")
        return value
    if name in _LIST_FIELDS:
        if name == "command" and isinstance(value, str):
            raise bad("a list of strings", 'command = ["python", "train.py"]')
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad("a list of strings", f'{name.replace("_", "-")} = ["..."]')
        return list(value)
    if _KINDS[name] == options.TABLE:
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise bad("a table of strings", 'env = { KEY = "value" }')
        return dict(value)
    if _KINDS[name] == options.SWEEP:
        if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
            raise bad("a table of lists", "[sweep]\nlr = [0.1, 0.01]")
        return dict(sweep_lib.check_sweep(k, v, label) for k, v in value.items())
    raise AssertionError(name)  # pragma: no cover


def merge(base: JobSpec, override: JobSpec, base_origins: Origins) -> tuple[JobSpec, Origins]:
    """``override``'s given fields win; ``env`` tables are merged key by key."""
    out = dataclasses.replace(base)
    origins = Origins(base_origins)
    for name in FIELD_NAMES:
        value = getattr(override, name)
        if value is None:
            continue
        if _KINDS[name] in (options.TABLE, options.SWEEP) and getattr(base, name):
            value = {**getattr(base, name), **value}
        setattr(out, name, value)
        origins[name] = cli_label(name)
    return out, origins


# ---------------------------------------------------------------- resolving
@dataclass(frozen=True)
class ResolvedJob:
    """A validated spec with every default filled in."""

    spec: JobSpec
    time_seconds: int | None
    port_low: int
    port_high: int
    warnings: tuple[str, ...] = field(default=())
    mounts: tuple = field(default=())  # parsed mounts (kit.launch.resolve fills them in)
    tasks: sweep_lib.TaskSet | None = None  # an array job's task indices
    params: tuple = field(default=())  # per task index (in tasks order): {NAME: value} of a sweep


def resolve(spec: JobSpec, origins: Origins | None = None, *, cwd: Path | None = None) -> ResolvedJob:
    """Validate ``spec`` and fill in defaults. Raises KitError naming the field."""
    origins = origins or Origins()
    s = dataclasses.replace(spec)
    for name, default in DEFAULTS.items():
        if getattr(s, name) is None:
            setattr(s, name, _copy(default))
    warnings: list[str] = []

    def err(name: str, message: str, hint: str | None = None) -> KitError:
        return KitError(message, field=origins.label(name), hint=hint)

    def at_least(name: str, low: int) -> None:
        value = getattr(s, name)
        if value is not None and value < low:
            raise err(name, f"must be at least {low}, got {value}")

    for name in sorted(_INT_FIELDS):  # what Slurm and bash hold (a 32-bit count, seconds)
        value = getattr(s, name)
        if isinstance(value, int) and value > MAX_INT:
            raise err(name, f"must be at most {MAX_INT}, got {value}")

    if not s.command:
        raise KitError("no command to run", field="command",
                       hint="put the command after --, e.g. kit launch --nodes 2 -- python -m kit.train")
    at_least("gpus_per_node", 0)
    if s.ntasks_per_node is None:
        s.ntasks_per_node = max(s.gpus_per_node, 1)
    for option in options.SPEC_OPTIONS:
        if option.minimum is not None:
            at_least(option.name, option.minimum)
    if s.gpus_per_node and s.ntasks_per_node not in (1, s.gpus_per_node):
        raise err("ntasks_per_node",
                  f"{s.ntasks_per_node} tasks per node do not match {s.gpus_per_node} GPUs per node",
                  hint=f"use --ntasks-per-node {s.gpus_per_node} (one rank per GPU) or 1 "
                       "(a per-node launcher such as torchrun that starts its own ranks)")
    _check_devices_in_command(s, origins)
    warnings.extend(_literal_task_variables(s.command))
    def parsed(name: str, parse):
        """``parse`` the field's value; its error names the field as the user spelled it."""
        try:
            return parse(getattr(s, name))
        except KitError as e:
            raise e.with_field(origins.label(name)) from None

    if s.mem is not None:
        s.mem = parsed("mem", parse_mem)
    time_seconds = parsed("time", parse_time) if s.time is not None else None
    if s.time is not None:
        s.time = s.time.strip()  # what sbatch gets is what was checked
    s.signal = parsed("signal", parse_signal)
    low, high = parsed("port_range", parse_port_range)
    parsed("exporter_ports", parse_port_range)
    if s.prometheus_targets is not None:
        targets = Path(s.prometheus_targets).expanduser()
        s.prometheus_targets = str(targets if targets.is_absolute() else (cwd or Path.cwd()) / targets)
    if time_seconds is not None and s.signal_lead >= time_seconds:
        raise err("signal_lead", f"the warning comes {s.signal_lead} s before a time limit of {time_seconds} s",
                  hint=f"use a --signal-lead below {time_seconds} or a longer --time")
    _check_exec_sizes(s, origins)
    for key, value in s.env.items():
        if len(key.encode()) + 1 + len(value.encode()) >= MAX_ENV_STRING:
            raise KitError(f"{key}: the value is {len(value.encode())} bytes; Linux passes at most "
                           f"{MAX_ENV_STRING - 1} bytes per variable (KEY=VALUE) to a process",
                           field=origins.label("env"), hint="put large values in a file and pass its path")
        if not _ENV_KEY.match(key):
            raise KitError(f"not a variable name: {key!r}", field=origins.label("env"),
                           hint="names are letters, digits and _, not starting with a digit")
        if key in RESERVED_ENV:
            raise KitError(f"{key} is set by the launcher from Slurm's variables", field=origins.label("env"),
                           hint="leave it out; kit maps SLURM_PROCID etc. to " + ", ".join(sorted(RESERVED_ENV)))
        if key.startswith(("KIT_", "SLURM_")) and key not in USER_KIT_ENV:
            raise KitError(f"{key}: names starting with KIT_ or SLURM_ are reserved", field=origins.label("env"))
    for name in ("job_name", "partition", "account", "output_dir", "master_interface"):
        value = getattr(s, name)
        if value is not None and value == "":
            raise err(name, "must not be empty")
    if len(s.job_name) > MAX_JOB_NAME:
        raise err("job_name", f"{len(s.job_name)} characters; at most {MAX_JOB_NAME}",
                  hint="a short name: it names the job directory and shows in squeue")
    _check_no_nul(s, origins)
    for arg in s.sbatch_args:
        if not arg.startswith("-"):
            raise KitError(f"{arg!r} is not an option", field=origins.label("sbatch_args"),
                           hint="pass options as --sbatch-arg=--constraint=a100 (the command goes after --)")
        owned = owned_sbatch_option(arg)
        if owned:
            raise KitError(f"{owned} is set by kit", field=origins.label("sbatch_args"),
                           hint=f"use kit's {OWNED_SBATCH[owned]} instead")
    if not re.fullmatch(r"[A-Za-z0-9_]{1,32}", s.mpi):
        raise err("mpi", f"not an MPI plugin name: {s.mpi!r}", hint="e.g. --mpi pmi2 or --mpi pmix (see srun --mpi=list)")
    if "\\" in s.output_dir:
        raise err("output_dir", f"{s.output_dir!r} contains a backslash, which sbatch's --output cannot express",
                  hint="choose a directory without backslashes")
    out_dir = Path(s.output_dir).expanduser()
    if not out_dir.is_absolute():
        out_dir = (cwd or Path.cwd()) / out_dir
    s.output_dir = str(out_dir)
    for item in s.after:
        parse_after(item, origins.label("after"))
    tasks, params = _resolve_tasks(s, origins)
    _check_container(s, origins, warnings)
    if s.time is None and any(n in origins for n in ("signal", "signal_lead", "max_restarts")):
        warnings.append("no --time given: the preemption warning only fires if the partition has a time limit")
    return ResolvedJob(spec=s, time_seconds=time_seconds, port_low=low, port_high=high,
                       warnings=tuple(warnings), tasks=tasks, params=params)


AFTER_KINDS = ("ok", "any", "notok")


def parse_after(item: str, label: str) -> tuple[str, str]:
    """``JOB[:ok|any|notok]`` -> (JOB, kind); JOB is a job id or a job directory."""
    job, sep, kind = item.rpartition(":")
    if not sep or kind not in AFTER_KINDS:
        job, kind = item, "ok"
    if not job or "\n" in job:
        raise KitError(f"expected JOB[:ok|any|notok], got {item!r}", field=label,
                       hint="e.g. --after 1234 (after it succeeded), --after 1234:any, --after kit-jobs/train-...:ok")
    return job, kind


def _resolve_tasks(s: JobSpec, origins: Origins) -> tuple[sweep_lib.TaskSet | None, tuple]:
    """The array's task indices, and each task's sweep values (placeholders checked)."""
    if not s.sweep:
        if s.array is None:
            return None, ()
        return sweep_lib.parse_tasks(s.array, origins.label("array")), ()
    combos = sweep_lib.combinations(s.sweep)
    tasks = sweep_lib.parse_tasks(s.array or "", origins.label("array"), count=len(combos))
    for word in s.command or []:  # every placeholder must name a parameter
        sweep_lib.substitute(word, combos[0], origins.label("command"))
    return tasks, tuple(combos[i] for i in tasks.indices)


def _check_container(s: JobSpec, origins: Origins, warnings: list[str]) -> None:
    """Check the container fields every scheduler shares; the image and mounts are
    checked and parsed by the container runtime's room (kit.launch.resolve)."""
    given = [n for n in ("container_workdir", "container_name") if getattr(s, n)]
    given += [n for n in ("mounts", "container_env") if getattr(s, n)]
    given += [n for n in ("container_writable", "container_mount_home", "container_remap_root") if getattr(s, n)]
    if not s.image:
        if given:
            warnings.append(", ".join(origins.label(n) for n in given) + " have no effect without --image")
        return
    if s.container_workdir is not None and not s.container_workdir.startswith("/"):
        raise KitError(f"must be an absolute path, got {s.container_workdir!r}",
                       field=origins.label("container_workdir"))
    for name in s.container_env:
        if not _ENV_KEY.match(name):
            raise KitError(f"not a variable name: {name!r}", field=origins.label("container_env"))
    if s.container_name is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", s.container_name):
        raise KitError(f"not a container name: {s.container_name!r}", field=origins.label("container_name"),
                       hint="letters, digits, '.', '_' and '-'")


def _copy(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return type(value)(value)
    return value


# What one execve may carry in all (arguments and environment): a quarter of
# the default 8 MiB stack is Linux's limit; kit keeps half of it for the
# environment Slurm, pyxis and kit add on the nodes.
MAX_COMMAND_BYTES = 1 << 20


def _check_exec_sizes(s: JobSpec, origins: Origins) -> None:
    """The command and environment must fit what Linux passes to a process."""
    for word in s.command or []:
        if len(word.encode()) + 1 > MAX_ENV_STRING:
            raise KitError(f"a command argument is {len(word.encode())} bytes; Linux passes at most "
                           f"{MAX_ENV_STRING - 1} bytes per argument", field=origins.label("command"),
                           hint="put large values in a file and pass its path")
    total = sum(len(w.encode()) + 1 for w in s.command or []) + \
        sum(len(k.encode()) + len(v.encode()) + 2 for k, v in s.env.items())
    if total > MAX_COMMAND_BYTES:
        raise KitError(f"the command and --env values come to {total} bytes; kit allows {MAX_COMMAND_BYTES} "
                       "(Linux's limit for one process, less what Slurm and kit add)",
                       field=origins.label("command"), hint="put large values in a file and pass its path")


SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})
# What differs from task to task: a `$NAME` of one of these in an argument is a per-task value the user
# expects a shell to fill in.
PER_TASK_VARIABLES = RESERVED_ENV | {"MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "HOSTNAME", "CUDA_VISIBLE_DEVICES"}
_DOLLAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def _literal_task_variables(command: list[str]) -> list[str]:
    """Warnings for ``$NAME`` of a per-task variable in an argument of a command no shell
    runs: kit passes arguments as they are (no shell expands them on the nodes)."""
    if not command or Path(command[0]).name in SHELLS:
        return []
    out = []
    for arg in command[1:]:
        names = [n for n in _DOLLAR.findall(arg) if n in PER_TASK_VARIABLES or n.startswith(("SLURM_", "PMI_"))]
        if names:
            out.append(f"the argument {arg!r} reaches {Path(command[0]).name} as written: no shell expands "
                       f"${names[0]} (kit runs the command without one); for a per-task value write "
                       f"-- bash -c '{command[0]} ... {arg} ...'")
    return out


def _check_devices_in_command(s: JobSpec, origins: Origins) -> None:
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
                raise KitError(f"the command asks for {flag} {value} but each node runs "
                               f"{s.ntasks_per_node} task(s)", field=origins.label("command"),
                               hint=f"use --ntasks-per-node {value}, or {flag} {s.ntasks_per_node}: "
                                    "Lightning hangs at 'Initializing distributed' when they differ")


def _check_no_nul(s: JobSpec, origins: Origins) -> None:
    def check(name: str, value: str) -> None:
        if "\0" in value:
            raise KitError("contains a NUL byte, which cannot reach a process", field=origins.label(name))
    for name in FIELD_NAMES:
        value = getattr(s, name)
        if isinstance(value, str):
            check(name, value)
        elif isinstance(value, list):
            for v in value:
                check(name, v)
        elif isinstance(value, dict):
            for k, v in value.items():
                check(name, k)
                check(name, v)


__all__ = ["JobSpec", "ResolvedJob", "Origins", "load_job_file", "merge", "resolve", "parse_mem",
           "parse_time", "parse_env_item", "parse_port_range"]
