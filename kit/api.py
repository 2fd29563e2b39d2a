"""kit from Python: the calls `kit launch`, `kit ps`, `kit logs`, `kit cancel` and
`kit report` make, as functions and a job handle (as submitit and NeMo-Run users drive jobs).

    import kit
    job = kit.launch(["python", "-m", "kit.train", "--max-steps", "100"], nodes=2, local=True)
    job.progress()             # step, loss, samples/s
    end = job.wait()           # Outcome: state, exit_code, meaning (the README's outcome table)

Every `kit launch` option is a keyword under its command-line name, dashes as
underscores (``--output-dir`` -> ``output_dir=``, ``--no-exporter`` ->
``no_exporter=True``, ``--local`` -> ``local=True``, ``--env`` -> ``env={"K": "v"}``,
``--mount`` -> ``mount=["/data:/data"]``); the same checks run and a bad value
raises :class:`kit.KitError` with the command's message (``error.field``,
``error.hint``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable

from kit import files, jobdir, listing, slurm, targets
from kit import snapshot as snapshots
from kit import submission as lib
from kit.core import options, sweep as sweep_lib
from kit.core import spec as specs
from kit.core.outcome import Outcome
from kit.errors import KitError
from kit.jobdir import JobDir, failures, records

__all__ = ["Job", "Outcome", "cancel", "jobs", "launch", "launch_with", "python_names", "rerun", "submit_spec"]


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


def _field_value(name: str, o: options.Option, value: Any) -> Any:
    """A keyword's value as the job spec holds it (the command line's types, Python's shapes)."""
    def bad(kind: str) -> KitError:
        return KitError(f"expected {kind}, got {type(value).__name__} {value!r}", field=o.label,
                        hint=f"e.g. kit.launch(..., {name}=...) as the README's option table says")
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
        return dict(specs.parse_env_item(item) for item in _strings(value, bad))
    if o.kind == options.SWEEP:  # {"lr": [0.1, 0.01]}, or ["lr=0.1,0.01", ...] as --sweep takes them
        if isinstance(value, dict):
            return dict(sweep_lib.check_sweep(k, v if isinstance(v, list) else [v], o.label) for k, v in value.items())
        return dict(sweep_lib.parse_sweep_item(item, o.label) for item in _strings(value, bad))
    items = _strings(value, bad)  # LIST
    if o.name == "container_env":
        return [n for item in items for n in item.split(",") if n]
    return items


def _strings(value: Any, bad) -> list[str]:
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]
    if not isinstance(value, Iterable) or isinstance(value, dict):
        raise bad("a string or a list of strings")
    out = [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
    if not all(isinstance(v, str) for v in out):
        raise bad("a list of strings")
    return out


def launch(command: list[str] | str | None = None, **kwargs: Any) -> Job:
    """Submit ``command`` (a list of words; a string is run by ``bash -c``) as `kit launch`
    does, with the same options and checks; returns its :class:`Job` (not submitted:
    ``dry_run=True``; ``wait=True``: after its end). ``json`` and ``parsable`` shape what the
    command prints and change nothing here."""
    return launch_with(command, kwargs)


def launch_with(command, kwargs: dict, before_submit=None) -> Job:
    """:func:`launch` with its keywords as a dict, and ``before_submit`` (see :func:`submit_spec`)."""
    fields, where = _fields(kwargs)
    if isinstance(command, str):
        command = ["bash", "-c", command]
    if command is not None:
        fields["command"] = _strings(command, lambda kind: KitError(f"expected {kind}", field="command"))
    job_file, dry_run, wait = fields.pop("job_file", None), fields.pop("dry_run", False), fields.pop("wait", False)
    fields.pop("as_json", None)
    fields.pop("parsable", None)
    base, origins = specs.load_job_file(job_file) if job_file else (specs.JobSpec(), specs.Origins())
    spec, origins = specs.merge(base, specs.JobSpec(**fields), origins)
    plan, prepared = submit_spec(spec, origins, where=where, dry_run=dry_run, before_submit=before_submit)
    job = Job(prepared.job_dir, job_id=prepared.job_id, target=plan.target, messages=plan.messages)
    if wait and not dry_run:
        job.wait()
    return job


def _fields(kwargs: dict) -> tuple[dict[str, Any], str | None]:
    """Keywords -> (job spec fields as the command line would give them, "local"/"site"/None)."""
    names = python_names()
    unknown = sorted(set(kwargs) - set(names))
    if unknown:
        raise KitError(f"unknown option {unknown[0]!r}", field=unknown[0],
                       hint="kit.launch takes `kit launch`'s options, dashes as underscores: " + ", ".join(sorted(names)))
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
            fields[o.name] = _field_value(name, o, value)
    return fields, where


def submit_spec(spec: specs.JobSpec, origins: specs.Origins, *, where: str | None = None, dry_run: bool = False,
                say=lambda message: None, before_submit=None, cwd: Path | None = None,
                rerun: lib.Rerun | None = None) -> tuple[lib.Plan, lib.PreparedJob]:
    """The launch itself, for `kit launch` and :func:`launch` alike: the target chosen, the
    job planned (resolved and checked once; ``cwd``: where the command starts, ``rerun``:
    what a rerun keeps), ``say`` told its warnings and notes, the job directory written,
    ``before_submit(prepared)`` given it to add to (on failure the directory goes), and
    (unless ``dry_run``) submitted."""
    plan = targets.plan(spec, origins, where=where, dry_run=dry_run, cwd=cwd, rerun=rerun)
    prepared = lib.prepare(plan.job)
    if before_submit is not None:
        try:
            before_submit(prepared)
        except BaseException:
            shutil.rmtree(prepared.job_dir, ignore_errors=True)
            raise
    for message in plan.messages:  # once the job is written: an error is the one thing a failed launch says
        say(message)
    if not dry_run:
        lib.submit(prepared, plan.target)
    return plan, prepared


def rerun(job_dir: str | Path, edits: dict[str, Any] | Iterable[str] = (), *, wait: bool = False) -> Job:
    """A new job with ``job_dir``'s resolved spec (its ``job.json``), in a new directory under
    the same output directory, submitted to the same Slurm; ``edits`` change fields first
    (``{"nodes": 4}``, or ``["nodes=4", "time=\"1:00:00\""]`` as TOML values, as a job file
    writes them). The new job records which job it reruns (``rerun_of.json``)."""
    source = Path(job_dir)
    jobdir.own(source)  # its spec decides what runs: only from a directory of the caller's own
    array = source.parent.parent if source.parent.name == JobDir.TASKS and source.name.isdigit() else None
    if array is not None and not os.path.lexists(source / JobDir.FUNCTION):
        raise KitError(f"{source} is one task of an array job: its task id and parameters come from the array",
                       field="JOB", hint=f"rerun the whole array: kit rerun {array}")
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
            setattr(spec, name, specs.coerce_value(name, value, f"{spec_file}: {name}"))
    edited = set()
    for name, value in (edits.items() if isinstance(edits, dict) else (_edit(item) for item in edits)):
        field = name.replace("-", "_")
        edited.add(field)
        if field not in specs.FIELD_NAMES:
            raise KitError(f"unknown field {name!r}", field="--edit",
                           hint="the fields are the job file's keys: " + ", ".join(specs.FIELD_NAMES))
        setattr(spec, field, specs.coerce_value(field, value, f"--edit {name}"))
        origins[field] = f"--edit {name}"
    if "sbatch_args" not in edited:  # a hold was for that submission: the rerun runs
        spec.sbatch_args = [a for a in spec.sbatch_args if a not in ("--hold", "-H")]
    record = json.dumps({"job_dir": str(source.resolve()), "job_id": records.job_id_of(source)}) + "\n"
    # The same code (the snapshot, started at the same place) unless an edit turned it off.
    snapshot = recorded.get("snapshot") if not edited & {"code", "code_snapshot"} else None
    workdir, image_source = recorded.get("workdir"), recorded.get("image_source")
    payloads = jobdir.function_payloads(source)

    def before_submit(prepared: lib.PreparedJob) -> None:
        for rel, data in payloads.items():  # a function job's call (kit.submit, kit.map), again
            files.write_atomic(prepared.job_dir / rel, data, 0o600)
        files.write_atomic(prepared.job_dir / JobDir.RERUN_OF, record)

    _, prepared = submit_spec(spec, origins, where=targets.target_of(source).name,
                              cwd=Path(workdir) if isinstance(workdir, str) and workdir.startswith("/") else None,
                              rerun=lib.Rerun(snapshots.load(snapshot) if isinstance(snapshot, dict) else None,
                                              image_source if isinstance(image_source, str) else None),
                              before_submit=before_submit)
    job = Job(prepared.job_dir, job_id=prepared.job_id)
    if wait:
        job.wait()
    return job


def _edit(item: str) -> tuple[str, Any]:
    """``KEY=VALUE``, the value read as TOML (``4``, ``true``, ``["a", "b"]``), else as a string."""
    import tomllib

    key, sep, value = item.partition("=")
    if not sep or not key:
        raise KitError(f"expected KEY=VALUE, got {item!r}", field="--edit", hint='e.g. --edit nodes=4 --edit time=60')
    try:
        return key, tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return key, value
    except RecursionError:
        raise KitError(f"{key}: the value is nested too deep", field="--edit",
                       hint='give a plain value, e.g. --edit nodes=4 or --edit \'command=["python", "t.py"]\'') from None


def jobs(*, output_dirs: Iterable[str | Path] = ("kit-jobs",), everything: bool = False) -> list[Job]:
    """The jobs `kit ps` lists, newest first (an array job's tasks each as a Job)."""
    rows = listing.list_jobs([Path(d) for d in output_dirs], everything=everything)
    out = []
    for row in rows:
        array_id, sep, task = row.id.partition("_")
        unit = JobDir(row.job_dir).task(int(task)).path if sep and task.isdigit() else Path(row.job_dir)
        out.append(Job(unit, job_id=row.id))
    return out


def cancel(job_dir: Path, reason: str | None = None) -> dict:
    """Cancel a job (every task of an array job), recording who and why in its directory
    (``cancelled.json``) before Slurm is asked; the record. KitError when it already ended."""
    job_id = records.job_id_of(job_dir)
    if job_id is None:
        raise KitError(f"{job_dir} was never submitted (no job_id in it)", field="JOB",
                       hint="a --dry-run writes the directory only")
    target = targets.target_of(job_dir)
    now = unit_states(target, job_dir, job_id)
    end = ended(now)
    if end:
        raise KitError(f"job {job_id} already ended ({end}): nothing to cancel", field="JOB", exit_code=1)
    rec = records.record_cancel(job_dir, reason, tasks=None if now.keys() == {None} else
                                [i for i, state in now.items() if not _final(state)])
    slurm.cancel(target, job_id)
    return rec


def unit_states(target: slurm.Target, job_dir: Path, job_id: str) -> dict[int | None, str]:
    """Slurm's state of the job ({None: state}), or of each task of an array job."""
    indices = records.task_indices(job_dir)
    if indices:
        return {i: st.state for i, st in slurm.array_status(target, job_id, indices).items()}
    return {None: slurm.job_status(target, job_id).state}


def _final(state: str) -> bool:
    return state in slurm.TERMINAL_STATES or state == "GONE"


def ended(states: dict[int | None, str]) -> str | None:
    """The end state(s) once the job (every task of an array job) has ended, else None."""
    if not all(_final(state) for state in states.values()):
        return None
    return ", ".join(sorted(set(states.values())))


class Job:
    """A submitted kit job (or one task of an array job), reopened from its directory."""

    def __init__(self, job_dir: str | Path, *, job_id: str | None = None, target: slurm.Target | None = None,
                 messages: Iterable[str] = (), array_states: slurm.ArrayStates | None = None):
        self.dir, self._target, self._array_states = Path(job_dir), target, array_states  # states: kit.map's
        self.id = job_id or records.job_id_of(self.dir)
        self.messages = list(messages)  # what `kit launch` would have printed (warnings, notes)

    @classmethod
    def from_dir(cls, job_dir: str | Path) -> Job:
        """The job in ``job_dir`` (a job directory, or an array task's ``tasks/<i>``)."""
        if not Path(job_dir).is_dir():
            raise KitError(f"no such job directory: {job_dir}", field="JOB")
        return cls(job_dir)

    def __repr__(self) -> str:
        return f"kit.Job({self.id or 'not submitted'}, {str(self.dir)!r})"

    @property
    def target(self) -> slurm.Target:
        if self._target is None:
            self._target = targets.target_of(self.dir)
        return self._target

    def _submitted(self) -> str:
        if self.id is None:
            raise KitError(f"{self.dir} was never submitted (a dry run)", field="JOB")
        return self.id

    def state(self) -> str:
        """Slurm's state (PENDING, RUNNING, COMPLETED, ...), or the job directory's once Slurm forgot it;
        a held job's is ``PENDING`` whose ``.note`` (and repr) says it is held and how to release it."""
        st = slurm.statuses(self.target, [self._submitted()]).get(self.id)
        if st is None or st.state == "GONE":
            return records.recorded_state(self.dir)
        if st.state in slurm.TERMINAL_STATES:
            records.keep_outcome(self.dir, st.state)
        return slurm.State(st.state, st.shown() if st.held else "")

    def done(self) -> bool:
        return self.state() in slurm.TERMINAL_STATES | {"ENDED"}

    def progress(self) -> records.Progress:
        """The training's latest step, loss and samples/s (what `kit ps` shows)."""
        return records.training_progress(self.dir)

    def wait(self, timeout: float | None = None, poll: float = 1.0) -> Outcome:
        """Block until the job ends (through requeues and controller outages); its outcome,
        as `kit launch --wait` tells it. KitError when ``timeout`` seconds pass first."""
        states, index = self._array_states, self._submitted().rpartition("_")[2]
        end = slurm.wait(self.target, self.id, poll=poll, timeout=timeout,
                         status=(lambda: states.status(int(index), poll)) if states else None)
        if end.state != "GONE":
            records.keep_outcome(self.dir, end.state)
        return slurm.job_outcome(end, self.dir, records.work_finished(self.dir))

    def __await__(self):
        return asyncio.get_running_loop().run_in_executor(None, self.wait).__await__()

    def cancel(self, reason: str | None = None) -> dict:
        """Cancel it as `kit cancel` does; the cancel record."""
        self._submitted()
        return cancel(self.dir, reason)

    def logs(self, rank: int | None = None, run: int | None = None, errors: bool = False) -> str:
        """A run's rank logs (all ranks, each line prefixed ``R: ``, or one rank's); with
        ``errors``, per run the first rank that failed by itself and its last lines."""
        runs = records.runs(self.dir)
        if errors:
            out = []
            for r in runs if run is None else [run]:
                f = failures.failure_tail(self.dir, r)
                if f is not None:
                    out.append(f"run {r}: {f.headline()}\n" + f.text)
            return "\n".join(out)
        run = run if run is not None else (runs[-1] if runs else 0)
        ranks = [rank] if rank is not None else records.ranks(self.dir, run)
        parts = []
        for r in ranks:
            path = JobDir(self.dir).rank_log(r, run)
            text = path.read_text(errors="replace") if path.is_file() else ""
            parts.append(text if rank is not None else "".join(f"{r}: {line}\n" for line in text.splitlines()))
        return "".join(parts)

    def rerun(self, wait: bool = False, **edits: Any) -> Job:
        """A new job with this one's resolved spec, ``edits`` applied (as `kit rerun --edit`),
        of this one's kind (a :class:`kit.FunctionJob`'s rerun is one)."""
        job = rerun(self.dir, edits)
        job = type(self)(job.dir, job_id=job.id, target=job._target)
        if wait:
            job.wait()
        return job

    def result(self, timeout: float | None = None) -> Any:
        """A function job's results are :class:`kit.FunctionJob`'s (``kit.FunctionJob.from_dir(d)``)."""
        raise KitError(f"{self.dir}: a kit.Job has no return value; open a function job (kit.submit, kit.map) as "
                       "kit.FunctionJob", field="JOB", hint=f"kit.FunctionJob.from_dir({str(self.dir)!r}).result()")

    results = result

    def report(self, prometheus: str | None = None) -> dict:
        """The numbers of `kit report` (report.json's), the picture written beside them."""
        from kit.cluster import LocalCluster
        from kit.report import report as make_report

        summary = make_report(self.dir, self._submitted(), self.dir / JobDir.REPORT,
                              prometheus or LocalCluster().prometheus_url())
        return asdict(summary)
