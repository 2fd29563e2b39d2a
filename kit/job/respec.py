"""A job's recorded spec, for ``kit rerun``: read back only from a job directory of the caller's own (its spec decides
what runs), every field checked as a job file's, the edits applied (``nodes=4``, or ``KEY=VALUE`` read as TOML)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from kit import files, jobdir, targets
from kit import submission as lib
from kit.code import snapshot as snapshots
from kit.core import jobfile
from kit.core import spec as specs
from kit.errors import KitError
from kit.jobdir import JobDir, records


def recorded(job_dir: str | Path, edits: dict[str, Any] | Iterable[str] = ()):
    """(the job directory, its job.json, the spec with ``edits`` applied, the fields' origins, the fields edited)."""
    source = Path(job_dir)
    jobdir.own(source)  # its spec decides what runs: only from a directory of the caller's own
    array = source.parent.parent if source.parent.name == JobDir.TASKS and source.name.isdigit() else None
    if array is not None and not os.path.lexists(source / JobDir.FUNCTION):
        raise KitError(
            f"{source} is one task of an array job: its task id and parameters come from the array",
            field="JOB",
            hint=f"rerun the whole array: kit rerun {array}",
        )
    spec_file = (array or source) / JobDir.SPEC
    try:
        recorded = files.read_json(jobdir.own(spec_file), 1 << 22)
    except (OSError, ValueError) as e:
        raise KitError(f"cannot read {spec_file}: {e}", field="JOB") from None
    if not isinstance(recorded, dict):
        raise KitError(f"{spec_file}: not a job spec", field="JOB")
    if array is not None:  # a kit.map task: its call again, as a job of its own
        recorded = {k: v for k, v in recorded.items() if k not in ("array", "sweep")}
    spec, origins = specs.JobSpec(), specs.Origins()
    for name, value in recorded.items():
        if name in specs.FIELD_NAMES:
            setattr(spec, name, jobfile.coerce_value(name, value, f"{spec_file}: {name}"))
    edited = set()
    for name, value in edits.items() if isinstance(edits, dict) else (edit(item) for item in edits):
        field = name.replace("-", "_")
        edited.add(field)
        if field not in specs.FIELD_NAMES:
            raise KitError(
                f"unknown field {name!r}",
                field="--edit",
                hint="the fields are the job file's keys: " + ", ".join(specs.FIELD_NAMES),
            )
        setattr(spec, field, jobfile.coerce_value(field, value, f"--edit {name}"))
        origins[field] = f"--edit {name}"
    return source, recorded, spec, origins, edited


def edit(item: str) -> tuple[str, Any]:
    """``KEY=VALUE``, the value read as TOML (``4``, ``true``, ``["a", "b"]``), else as a string."""
    tomllib = files.toml()
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise KitError(f"expected KEY=VALUE, got {item!r}", field="--edit", hint="e.g. --edit nodes=4 --edit time=60")
    try:
        return key, tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return key, value
    except RecursionError:
        raise KitError(
            f"{key}: the value is nested too deep",
            field="--edit",
            hint='give a plain value, e.g. --edit nodes=4 or --edit \'command=["python", "t.py"]\'',
        ) from None


@dataclass(frozen=True)
class Again:
    """What a rerun submits: the recorded spec as edited, where and from where, the same code and image, and
    what goes in its directory before it is submitted (a function job's call, ``rerun_of.json``)."""

    spec: Any
    origins: specs.Origins
    where: str
    cwd: Path | None
    rerun: lib.Rerun
    before_submit: Callable[[lib.PreparedJob], None]


def again(job_dir: str | Path, edits: dict[str, Any] | Iterable[str] = ()) -> Again:
    """``job_dir``'s job again (:func:`kit.api.rerun`), ``edits`` applied."""
    source, recorded_spec, spec, origins, edited = recorded(job_dir, edits)
    if "sbatch_args" not in edited:  # a hold was for that submission: the rerun runs
        spec.sbatch_args = [a for a in spec.sbatch_args if a not in ("--hold", "-H")]
    # The rerun is a new job, so a new tracker run: the record names the one it reruns.
    record = (
        json.dumps(
            {
                "job_dir": str(source.resolve()),
                "job_id": records.job_id_of(source),
                "tracker_run_id": JobDir(source).tracker_run_id,
            }
        )
        + "\n"
    )
    # The same code (the snapshot, started at the same place) unless an edit turned it off.
    snapshot = recorded_spec.get("snapshot") if not edited & {"code", "code_snapshot"} else None
    workdir, image_source = recorded_spec.get("workdir"), recorded_spec.get("image_source")
    payloads = jobdir.function_payloads(source)

    def before_submit(prepared: lib.PreparedJob) -> None:
        for rel, data in payloads.items():  # a function job's call (kit.submit, kit.map), again
            files.write_atomic(prepared.job_dir / rel, data, 0o600)
        files.write_atomic(prepared.job_dir / JobDir.RERUN_OF, record)

    return Again(
        spec,
        origins,
        targets.target_of(source).name,
        Path(workdir) if isinstance(workdir, str) and workdir.startswith("/") else None,
        lib.Rerun(
            snapshots.load(snapshot) if isinstance(snapshot, dict) else None,
            image_source if isinstance(image_source, str) else None,
        ),
        before_submit,
    )
