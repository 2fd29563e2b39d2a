"""Python keywords as `kit launch` options: ``kit.launch(..., output_dir=..., no_exporter=True)``
takes every option under its command-line name, dashes as underscores, with Python's shapes
(``env={"K": "v"}``, ``mount=[...]``, a path for a string), handed over as given and checked where a job file's
values are (:func:`kit.core.jobfile.coerce_value`)."""

from __future__ import annotations

import os
from typing import Any, Iterable

from kit.core import jobfile, options
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


def strings(value: Any, bad) -> list[str]:
    """A string or path, or a list of them, as a list of strings (``bad(kind)`` is the error): the command."""
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
        elif value is not None:  # as given (a --no-x keyword the field's opposite), checked with the job file's
            given = jobfile.normalised(value)
            if o.kind == options.OFF and isinstance(given, bool):
                given = not given
            elif o.kind == options.LIST and isinstance(given, str):  # mount="/data:/data": a list of one
                given = [given]
            elif o.kind == options.TABLE and isinstance(given, dict):  # env={"N": 2}: the variable's text
                given = {str(k): str(v) for k, v in given.items()}
            elif o.kind == options.SWEEP and isinstance(given, dict):  # sweep={"lr": 0.1}: one value
                given = {k: v if isinstance(v, list) else [v] for k, v in given.items()}
            fields[o.name] = given
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
