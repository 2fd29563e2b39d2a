"""Python keywords as `kit launch` options: ``kit.launch(..., output_dir=..., no_exporter=True)``
takes every option under its command-line name, dashes as underscores, with Python's shapes
(``env={"K": "v"}``, ``mount=[...]``, a path for a string), checked as the command line is."""

from __future__ import annotations

import os
from typing import Any, Iterable

from kit.core import jobfile, options
from kit.core import spec as specs
from kit.core import sweep as sweep_lib
from kit.errors import KitError


def python_names() -> dict[str, options.Option]:
    """Each keyword :func:`launch` takes -> its option (``--no-exporter`` -> ``no_exporter``)."""
    out = {}
    for o in options.OPTIONS:
        if o.name == "command":
            continue
        flags = [flag for flag, _, _ in o.choices] if o.kind == options.CHOICE else [o.label]
        for flag in flags:
            out[flag.lstrip("-").replace("-", "_")] = o
    return out


def field_value(name: str, o: options.Option, value: Any) -> Any:
    """A keyword's value as the job spec holds it (the command line's types, Python's shapes)."""

    def bad(kind: str) -> KitError:
        return KitError(
            f"expected {kind}, got {type(value).__name__} {value!r}",
            field=o.label,
            hint=f"e.g. kit.launch(..., {name}=...) as docs/launch.md's option table says",
        )

    if o.kind in options.BOOLS:
        if not isinstance(value, bool):
            raise bad("True or False")
        return (not value) if o.kind == options.OFF else value
    if o.kind == options.INT:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("a whole number")
        return value
    if o.kind == options.STR:
        if o.name in ("mem", "time") and isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if o.kind == options.TABLE:  # env: {"K": "v"}, or ["K=v", ...] as --env takes them
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return dict(specs.parse_env_item(item) for item in strings(value, bad))
    if o.kind == options.SWEEP:  # {"lr": [0.1, 0.01]}, or ["lr=0.1,0.01", ...] as --sweep takes them
        if isinstance(value, dict):
            return dict(sweep_lib.check_sweep(k, v if isinstance(v, list) else [v], o.label) for k, v in value.items())
        return dict(sweep_lib.parse_sweep_item(item, o.label) for item in strings(value, bad))
    items = strings(value, bad)  # LIST
    if o.name == "container_env":
        return [n for item in items for n in item.split(",") if n]
    return items


def strings(value: Any, bad) -> list[str]:
    """A string or path, or a list of them, as a list of strings (``bad(kind)`` is the error)."""
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]
    if not isinstance(value, Iterable) or isinstance(value, dict):
        raise bad("a string or a list of strings")
    out = [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
    if not all(isinstance(v, str) for v in out):
        raise bad("a list of strings")
    return out


def fields(kwargs: dict) -> tuple[dict[str, Any], str | None]:
    """Keywords -> (job spec fields as the command line would give them, "local"/"site"/None)."""
    names = python_names()
    unknown = sorted(set(kwargs) - set(names))
    if unknown:
        import difflib

        field_of = options.BY_NAME.get(unknown[0])  # a spec field's name whose keyword is its flag's
        guess = [k for k, o in names.items() if o is field_of] or difflib.get_close_matches(unknown[0], names, 1)
        raise KitError(
            f"unknown option {unknown[0]!r}" + (f": did you mean {guess[0]}?" if guess else ""),
            field=unknown[0],
            hint="kit.launch takes `kit launch`'s options, dashes as underscores: " + ", ".join(sorted(names)),
        )
    fields: dict[str, Any] = {}
    where = None
    for name, value in kwargs.items():
        o = names[name]
        if o.kind == options.CHOICE:
            if value is True:
                if where is not None:
                    raise KitError("give one of " + ", ".join(f for f, _, _ in o.choices), field=f"--{name}")
                where = name
            elif value is not False and value is not None:
                raise KitError(f"expected True or False, got {value!r}", field=f"--{name}")
        elif value is not None:
            fields[o.name] = field_value(name, o, value)
    return fields, where


def request(command: list[str] | str | None, kwargs: dict) -> jobfile.Request:
    """:func:`kit.launch`'s call as the one request a launch is, here or on a login node: the fields given (the
    command a string's ``bash -c``), checked here as :func:`fields` checks them."""
    given, where = fields(kwargs)
    if isinstance(command, str):
        command = ["bash", "-c", command]
    if command is not None:
        given["command"] = strings(command, lambda kind: KitError(f"expected {kind}", field="command"))
    how = {k: given.pop(k) for k in ("job_file", "dry_run", "wait", "as_json", "parsable") if k in given}
    return jobfile.Request(
        given, where, how.get("job_file"), *(bool(how.get(k)) for k in ("dry_run", "wait", "as_json", "parsable"))
    )
