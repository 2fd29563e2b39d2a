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

from kit.core import command, options, sidecar
from kit.core import notify as targets
from kit.core import sweep as sweep_lib
from kit.core.values import (
    ACTIONS,
    ENV_KEY,
    OWNED_SBATCH,
    owned_sbatch_option,
    parse_action,
    parse_after,
    parse_env_item,
    parse_mem,
    parse_port_range,
    parse_signal,
    parse_time,
)
from kit.errors import KitError


def _to_dict(self) -> dict[str, Any]:
    return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def _spec_class(name: str, doc: str) -> type:
    return dataclasses.make_dataclass(
        name,
        [(o.name, o.python_type | None, field(default=None)) for o in options.SPEC_OPTIONS],
        namespace={"to_dict": _to_dict, "__doc__": doc, "__module__": __name__},
    )


# A field per option of kit.core.options (its one declaration).
JobSpec = _spec_class("JobSpec", "Everything that describes one job. ``None``: not given (a default applies).")
FIELD_NAMES = tuple(o.name for o in options.SPEC_OPTIONS)


class CheckedSpec(JobSpec):
    """A JobSpec as resolve checked it: never assigned again (FrozenInstanceError); what is decided later is
    a field of ResolvedJob's. (A subclass rather than a second generated dataclass: its 60 fields' methods
    generated again cost every kit command 4 ms.)"""

    __hash__ = None  # its lists are not hashable: as a frozen dataclass of them

    def __init__(self, **values: Any) -> None:
        unknown = set(values) - set(FIELD_NAMES)
        if unknown:
            raise TypeError(f"CheckedSpec got unexpected fields {sorted(unknown)}")
        for name in FIELD_NAMES:
            object.__setattr__(self, name, values.get(name))

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


DEFAULTS: dict[str, Any] = {o.name: o.default for o in options.SPEC_OPTIONS if o.default is not None}

MAX_INT = 2**31 - 1  # counts and seconds: what Slurm's fields and bash arithmetic hold
MAX_JOB_NAME = 200


class Origins(dict):
    """Maps a field name to the label the user knows it by."""

    def label(self, name: str) -> str:
        return self.get(name) or cli_label(name)


def cli_label(name: str) -> str:
    """How the command line spells a field: ``--gpus-per-node``, ``--sbatch-arg``."""
    option = options.BY_NAME.get(name)
    return option.label if option else "--" + name.replace("_", "-")


_KINDS = {o.name: o.kind for o in options.SPEC_OPTIONS}
_INT_FIELDS = {n for n, k in _KINDS.items() if k == options.INT}
_STR_FIELDS = {n for n, k in _KINDS.items() if k == options.STR}
_LIST_FIELDS = {n for n, k in _KINDS.items() if k == options.LIST}
_BOOL_FIELDS = {n for n, k in _KINDS.items() if k in options.BOOLS}


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
    """A validated spec with every default filled in, frozen; what is decided after the check is a
    field of its own, set with ``dataclasses.replace`` (the spec keeps what the user asked for)."""

    spec: CheckedSpec
    time_seconds: int | None
    port_low: int
    port_high: int
    warnings: tuple[str, ...] = field(default=())
    mounts: tuple = field(default=())  # parsed mounts (kit.submission.resolve fills them in)
    tasks: sweep_lib.TaskSet | None = None  # an array job's task indices
    params: tuple = field(default=())  # per task index (in tasks order): {NAME: value} of a sweep
    workdir: str | None = None  # where the command starts (absolute): the submission directory
    snapshot: Any = None  # the code snapshot (kit.code.snapshot.Snapshot) every run runs, if any
    image: str | None = None  # what the job runs: the checked image reference, then its pinned copy
    image_digest: str | None = None  # sha256 of an --image file, pinned at submission
    image_source: str | None = None  # the --image path as given (a rerun's: the first job's)
    after: tuple[str, ...] = ()  # the --after dependencies checked, as "JOBID:kind"
    container_name: str | None = None  # the name pyxis keeps the container under: the user's, or kit's where
    # the site's pyxis removes a job's named containers in its epilog


def resolve(spec: JobSpec, origins: Origins | None = None, *, cwd: Path | None = None) -> ResolvedJob:
    """Validate ``spec`` and fill in defaults. Raises KitError naming the field."""
    origins = origins or Origins()
    s = dataclasses.replace(spec)
    for name, default in DEFAULTS.items():
        if getattr(s, name) is None:
            setattr(s, name, _copy(default))
    warnings: list[str] = []
    if not s.command:
        raise KitError(
            "no command to run",
            field="command",
            hint="put the command after --, e.g. kit launch --nodes 2 -- python -m kit.train",
        )
    _check_counts(s, origins)
    command.check_devices(s, origins)
    warnings.extend(command.literal_task_variables(s.command))

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
    for name in ACTIONS:
        setattr(s, name, parsed(name, lambda value, field=name: parse_action(field, value)))
    low, high = parsed("port_range", parse_port_range)
    parsed("exporter_ports", parse_port_range)
    if s.prometheus_targets is not None:
        s.prometheus_targets = str(_absolute(s.prometheus_targets, cwd))
    if time_seconds is not None and s.signal_lead >= time_seconds:
        raise _err(
            origins,
            "signal_lead",
            f"the warning comes {s.signal_lead} s before a time limit of {time_seconds} s",
            hint=f"use a --signal-lead below {time_seconds} or a longer --time",
        )
    command.check_exec_sizes(s, origins)
    command.check_env(s, origins)
    sidecar.check_sidecars(s, origins)
    _check_words(s, origins)
    s.output_dir = str(_absolute(s.output_dir, cwd))
    _check_contradictions(s, origins)
    if s.code is not None:
        s.code = str(_absolute(s.code, cwd))
    for item in s.after:
        parse_after(item, origins.label("after"))
    notify = parsed("notify", targets.parse_all)
    if any(t.kind == targets.MAIL for t in notify) and len(f"{s.job_name}x".splitlines()) > 1:
        raise _err(  # the name is in each mail's Subject, a header of one line
            origins,
            "job_name",
            f"{s.job_name!r} holds a line break",
            hint="a mail's Subject is one line: name the job so",
        )
    tasks, params = _resolve_tasks(s, origins)
    _check_container(s, origins, warnings)
    warnings.extend(command.restarts_blind(s, origins))
    if s.time is None and any(n in origins for n in ("signal", "signal_lead", "max_restarts")):
        warnings.append("no --time given: the preemption warning only fires if the partition has a time limit")
    return ResolvedJob(
        spec=CheckedSpec(**{n: getattr(s, n) for n in FIELD_NAMES}),
        time_seconds=time_seconds,
        port_low=low,
        port_high=high,
        warnings=tuple(warnings),
        tasks=tasks,
        params=params,
        workdir=str((cwd or Path.cwd()).absolute()),
        image=s.image,
    )


def _err(origins: Origins, name: str, message: str, hint: str | None = None) -> KitError:
    return KitError(message, field=origins.label(name), hint=hint)


def _absolute(path: str, cwd: Path | None) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (cwd or Path.cwd()) / p


def _check_counts(s: JobSpec, origins: Origins) -> None:
    """Every whole number within what Slurm and bash hold and at least its option's minimum
    (kit.core.options); ``ntasks_per_node`` defaults from the GPUs and must match them."""
    for name in sorted(_INT_FIELDS):  # what Slurm and bash hold (a 32-bit count, seconds)
        value = getattr(s, name)
        if isinstance(value, int) and value > MAX_INT:
            raise _err(origins, name, f"must be at most {MAX_INT}, got {value}")

    def at_least(name: str, low: int) -> None:
        value = getattr(s, name)
        if value is not None and value < low:
            raise _err(origins, name, f"must be at least {low}, got {value}")

    for option in options.SPEC_OPTIONS:  # each option's minimum, from its one declaration
        if option.minimum is not None:
            at_least(option.name, option.minimum)
    if s.ntasks_per_node is None:
        s.ntasks_per_node = max(s.gpus_per_node, 1)
    if s.gpus_per_node and s.ntasks_per_node not in (1, s.gpus_per_node):
        raise _err(
            origins,
            "ntasks_per_node",
            f"{s.ntasks_per_node} tasks per node do not match {s.gpus_per_node} GPUs per node",
            hint=f"use --ntasks-per-node {s.gpus_per_node} (one rank per GPU) or 1 "
            "(a per-node launcher such as torchrun that starts its own ranks)",
        )


def _check_words(s: JobSpec, origins: Origins) -> None:
    """Names that must not be empty, the job name's length, NUL bytes, sbatch options kit
    owns, the MPI plugin's name and what sbatch's --output can express."""
    for name in ("job_name", "partition", "account", "output_dir", "master_interface"):
        value = getattr(s, name)
        if value is not None and value == "":
            raise _err(origins, name, "must not be empty")
    if len(s.job_name) > MAX_JOB_NAME:
        raise _err(
            origins,
            "job_name",
            f"{len(s.job_name)} characters; at most {MAX_JOB_NAME}",
            hint="a short name: it names the job directory and shows in squeue",
        )
    _check_no_nul(s, origins)
    for arg in s.sbatch_args:
        if not arg.startswith("-"):
            raise KitError(
                f"{arg!r} is not an option",
                field=origins.label("sbatch_args"),
                hint="pass options as --sbatch-arg=--constraint=a100 (the command goes after --)",
            )
        owned = owned_sbatch_option(arg)
        if owned:
            raise KitError(
                f"{owned} is set by kit",
                field=origins.label("sbatch_args"),
                hint=f"use kit's {OWNED_SBATCH[owned]} instead"
                if OWNED_SBATCH[owned].startswith("-")
                else f"kit sets it itself: {OWNED_SBATCH[owned]}",
            )
    if not re.fullmatch(r"[A-Za-z0-9_]{1,32}", s.mpi):
        raise _err(
            origins,
            "mpi",
            f"not an MPI plugin name: {s.mpi!r}",
            hint="e.g. --mpi pmi2 or --mpi pmix (see srun --mpi=list)",
        )
    if "\\" in s.output_dir:
        raise _err(
            origins,
            "output_dir",
            f"{s.output_dir!r} contains a backslash, which sbatch's --output cannot express",
            hint="choose a directory without backslashes",
        )


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
    checked and parsed by the container runtime's room (kit.submission.resolve)."""
    given = [n for n in ("container_workdir", "container_name") if getattr(s, n)]
    given += [n for n in ("mounts", "container_env") if getattr(s, n)]
    given += [n for n in ("container_writable", "container_mount_home", "container_remap_root") if getattr(s, n)]
    if not s.image:
        if given:
            verb = "has" if len(given) == 1 else "have"
            warnings.append(", ".join(origins.label(n) for n in given) + f" {verb} no effect without --image")
        return
    if s.container_workdir is not None and not s.container_workdir.startswith("/"):
        raise KitError(
            f"must be an absolute path, got {s.container_workdir!r}", field=origins.label("container_workdir")
        )
    for name in s.container_env:
        if not ENV_KEY.match(name):
            raise KitError(f"not a variable name: {name!r}", field=origins.label("container_env"))
    if s.container_name is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", s.container_name):
        raise KitError(
            f"not a container name: {s.container_name!r}",
            field=origins.label("container_name"),
            hint="letters, digits, '.', '_' and '-'",
        )


def _check_contradictions(s: JobSpec, origins: Origins) -> None:
    if s.code is not None and not s.code_snapshot:
        raise _err(origins, "code", "--code and --no-code-snapshot contradict each other", hint="give one of them")
    if s.on_straggler != "tell" and not s.exporter:  # the verdicts are the exporter's: none would ever come
        raise _err(
            origins,
            "on_straggler",
            f"{s.on_straggler} acts on the exporter's straggler verdicts; the job runs none ({origins.label('exporter')})",
            hint="keep the exporter (it judges the ranks), or leave --on-straggler at tell (the default)",
        )


def _copy(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return type(value)(value)
    return value


def _check_no_nul(s: JobSpec, origins: Origins) -> None:
    for name in FIELD_NAMES:
        value = getattr(s, name)
        if isinstance(value, dict):
            value = [word for item in value.items() for word in item]
        for word in [value] if isinstance(value, str) else value if isinstance(value, list) else ():
            if isinstance(word, str) and "\0" in word:
                raise KitError("contains a NUL byte, which cannot reach a process", field=origins.label(name))


__all__ = [
    "JobSpec",
    "ResolvedJob",
    "Origins",
    "merge",
    "resolve",
    "parse_mem",
    "parse_time",
    "parse_env_item",
    "parse_port_range",
]
