"""The job file's dictionary: a TOML job file's keys (``-f job.toml``), and the same dictionary as a launch
crosses to a login node (:class:`Request`, JSON) — so every value a local launch accepts is accepted there,
checked there as a job file's values are.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit import files
from kit.core import options
from kit.core import sweep as sweep_lib
from kit.core.spec import (
    _BOOL_FIELDS,
    _INT_FIELDS,
    _KINDS,
    _LIST_FIELDS,
    _STR_FIELDS,
    FIELD_NAMES,
    JobSpec,
    Origins,
    cli_label,
    merge,
)
from kit.core.values import parse_env_item
from kit.errors import KitError

JOB_FILE_LIMIT = 4 << 20  # a job file is a few lines; /dev/zero is not one


def load_job_file(path: str | Path) -> tuple[JobSpec, Origins]:
    """Read a TOML job file: top-level keys are JobSpec fields (dashes or underscores)."""
    p = Path(path)
    label = str(path)
    try:
        data = files.read_toml(p, JOB_FILE_LIMIT)
    except FileNotFoundError:
        raise KitError(
            f"no such job file: {path}",
            field="--job-file",
            hint="give the path of a TOML job file (see docs/launch.md: job files)",
        ) from None
    except OSError as e:
        raise KitError(f"cannot read {path}: {e.strerror}", field="--job-file") from None
    except ValueError as e:
        raise KitError(
            f"not valid TOML: {e}", field=label, hint='fix the file; TOML strings need quotes, e.g. time = "1:00:00"'
        ) from None
    return spec_from(data, label, lambda key: f"{label}: {key}")


def spec_from(data: dict, where: str, label_of) -> tuple[JobSpec, Origins]:
    """A job file's keys (dashes or underscores) and values, checked as a job file's: (the spec, each field's
    origin, ``label_of(key)``); an unknown key is refused naming ``where``."""
    spec, origins = JobSpec(), Origins()
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in FIELD_NAMES:
            raise KitError(
                f"unknown key {key!r}",
                field=where,
                hint="valid keys: " + ", ".join(n.replace("_", "-") for n in FIELD_NAMES),
            )
        setattr(spec, name, coerce_value(name, value, label_of(key)))
        origins[name] = label_of(key)
    return spec, origins


def coerce_value(name: str, value: Any, label: str) -> Any:
    """The one check of a field's value, whoever gave it: a job file's (TOML), the command line's and
    ``kit.launch``'s keywords (handed over as given, normalised: :func:`normalised`), a rerun's edit. Each kind's
    shapes: a whole number; a string (``mem`` and ``time`` also a whole number); true or false; a list of strings
    (``container_env``'s items also comma lists); a table of strings (``env``; also ``KEY=VALUE`` items, as
    ``--env`` takes them); a table of lists (``sweep``; also ``NAME=V1,V2`` items, as ``--sweep`` takes them)."""
    toml, python = _EXAMPLES.get(_KINDS[name], ("", ""))
    flag = name.replace("_", "-")

    def bad(kind: str) -> KitError:
        example = f"{flag} = {toml}" if toml else ""
        return KitError(
            f"expected {kind}, got {type(value).__name__} {value!r}",
            field=label,
            hint=f"write it as {example} in a job file, {name}={python} in kit.launch" if example else None,
        )

    if name in _INT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("a whole number")
        return value
    if name in _STR_FIELDS:
        if name in ("mem", "time") and isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if name in _BOOL_FIELDS:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if name in _LIST_FIELDS:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad("a list of strings")
        return [n for item in value for n in item.split(",") if n] if name == "container_env" else list(value)
    if _KINDS[name] == options.TABLE:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            try:
                return dict(parse_env_item(item) for item in value)
            except KitError as e:
                raise e.with_field(label) from None
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise bad("a table of strings")
        return {str(k): v for k, v in value.items()}
    if _KINDS[name] == options.SWEEP:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return dict(sweep_lib.parse_sweep_item(item, label) for item in value)
        if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
            raise bad("a table of lists")
        return dict(sweep_lib.check_sweep(k, v, label) for k, v in value.items())
    raise AssertionError(name)  # pragma: no cover


# Each kind's value as a job file writes it, and as kit.launch takes it (a bad value's hint).
_EXAMPLES = {
    options.INT: ("2", "2"),
    options.STR: ('"..."', '"..."'),
    options.FLAG: ("true", "True"),
    options.SWITCH: ("true", "True"),
    options.OFF: ("false", "False"),
    options.LIST: ('["..."]', '["..."]'),
    options.TABLE: ('{ KEY = "value" }', '{"KEY": "value"}'),
    options.SWEEP: ("{ lr = [0.1, 0.01] }", '{"lr": [0.1, 0.01]}'),
}


def normalised(value: Any) -> Any:
    """A value as the caller gave it, in the shapes a job file's dictionary has (a tuple or set a list, a path a
    string, within lists and tables too); checked by :func:`coerce_value`, never converted otherwise."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, dict):
        return {k: normalised(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [normalised(v) for v in value]
    return value


@dataclass(frozen=True)
class Request:
    """One launch, as it crosses to a login node (``kit --host LOGIN launch``, ``kit.launch(host=)``): ``fields``,
    the job's fields given (a job file's dictionary: ``nodes``, ``sweep``, ``env``, ``command`` …), with how to
    launch it. The login node reads it back with :meth:`from_json` and launches :meth:`spec` as a local launch
    does; nothing of it is ever a command line parsed again."""

    fields: dict
    where: str | None = None  # "local" or "site" (None: kit chooses)
    job_file: str | None = None
    dry_run: bool = False
    wait: bool = False
    as_json: bool = False
    parsable: bool = False

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), ensure_ascii=True)

    @classmethod
    def from_json(cls, text: str) -> "Request":
        """A request the laptop sent; :class:`KitError` when it is not one (its fields are checked by :meth:`spec`)."""
        try:
            value = json.loads(text)
            request = cls(**value)
        except (ValueError, TypeError) as e:
            raise KitError(f"the laptop sent no launch: {e}", field="remote-launch", exit_code=2) from None
        kinds = {
            "where": (str, type(None)),
            "job_file": (str, type(None)),
            "fields": dict,
            **{k: bool for k in ("dry_run", "wait", "as_json", "parsable")},
        }
        if not all(isinstance(getattr(request, k), t) for k, t in kinds.items()):
            raise KitError("the laptop sent a launch kit cannot read", field="remote-launch", exit_code=2)
        return request

    def spec(self) -> tuple[JobSpec, Origins]:
        """The job: the job file's (when one is named), the given fields over it, each checked as a job file's
        value and named as the command line names it."""
        base, origins = load_job_file(self.job_file) if self.job_file else (JobSpec(), Origins())
        given, _ = spec_from(self.fields, "--host", cli_label)
        return merge(base, given, origins)

    def with_fields(self, **changes: Any) -> "Request":
        return dataclasses.replace(self, fields={**self.fields, **changes})
