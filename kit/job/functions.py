"""Python functions as kit jobs, here: ``kit.submit(fn, *args)`` (:mod:`kit.api`) runs ``fn(*args)`` on every
rank, ``kit.map(fn, items)`` one array task per item. The call is pickled with cloudpickle (:func:`pickled`)
into the job directory (``function.pkl``); every rank runs ``python -m kit.train.function`` and leaves its
return value or exception in ``results/``; :func:`results` reads them back."""

from __future__ import annotations

import base64
import os
import pickle
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from kit import files, jobdir, slurm
from kit import submission as lib
from kit.core.outcome import Outcome
from kit.errors import KitError
from kit.image import info, is_reference
from kit.job import settle
from kit.job.handle import Job, launch_with
from kit.job.hosting import hosted
from kit.jobdir import JobDir, records

__all__ = ["FunctionJob", "RemoteError", "check_image_python", "pickled", "pickled_each", "results"]


class RemoteError(KitError):
    """A function job's call raised on a rank: ``rank``, ``node``, ``type`` and the remote ``traceback``."""

    def __init__(self, record: dict):
        self.record = record
        self.rank, self.node = record.get("rank"), record.get("node")
        self.type, self.traceback = record.get("type"), str(record.get("traceback") or "")
        where = last_frames(self.traceback)
        super().__init__(
            f"rank {self.rank} on {self.node} raised {self.type}: {record.get('message', '')}"
            + (f"\n{where}" if where else ""),
            field="fn",
            exit_code=1,
            detail=self.traceback.rstrip(),
        )


class FunctionJob(Job):
    """A function job (:func:`submit`, one task of :func:`map`): a :class:`kit.Job` whose ranks
    leave return values. ``kit.FunctionJob(job_dir)`` reopens one from its directory."""

    def result(self, timeout: float | None = None) -> Any:
        """Rank 0's return value, after the job's end."""
        return self.results(timeout)[0]

    batch: "dict[str, dict] | None" = None  # on a login node, a kit.map's tasks' values as they come

    @hosted(
        serve=lambda job, args: _results_there(job, args), laptop=lambda job, timeout=None: _results_here(job, timeout)
    )
    def results(self, timeout: float | None = None) -> list:
        """Every rank's return value, by rank, as soon as every rank of the job's first run returned (else after
        the job's end); the first rank that raised raises :class:`kit.RemoteError` here (its node and traceback
        with it)."""
        end = self.wait(timeout, on_state=_waiting_told(self._submitted()), until=lambda: every_rank_returned(self.dir))
        return results(self.dir, self.id, end)


def _waiting_told(job_id: str) -> Callable:
    """A wait's ``on_state`` that tells standard error, once per reason, that the job is pending and why (Slurm's
    reason; a held job: how to release it) — a result that does not come is not waited for in silence."""
    told: list[str] = []

    def on_state(st) -> None:
        if st.state != "PENDING" or st.reason in ("", "None") or st.reason in told:
            return
        told.append(st.reason)
        why = st.shown() if st.held else f"PENDING ({st.reason}{': ' + st.detail if st.detail else ''})"
        print(f"kit: job {job_id} is waiting to start: {why}", file=sys.stderr, flush=True)

    return on_state


def last_frames(traceback: str, count: int = 3) -> str:
    """The last ``count`` frames of a formatted traceback (its ``File "...", line N, in f`` lines
    and their source lines): where the remote call failed, in the exception's own text."""
    lines = traceback.rstrip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    out = []
    for i in frames[-count:]:
        out.append(lines[i])
        if i + 1 < len(lines) and lines[i + 1].startswith("    "):
            out.append(lines[i + 1])
    return "\n".join(out)


def pickled(fn: Callable, args: tuple) -> bytes:
    """``fn(*args)`` pickled for a function job (``kit.submit``): see :func:`kit.api.submit` for what travels."""
    try:
        return _dumps(fn, (fn, args, {}))
    except Exception as e:  # what cloudpickle raises for an unpicklable call varies
        raise KitError(
            f"cannot pickle {getattr(fn, '__name__', fn)!r} and its arguments: {e}",
            field="fn",
            hint="a function job's call travels pickled: pass plain data, open files and connections "
            "inside the function",
        ) from None


def submit_payload(payload: bytes, kwargs: dict, make: type[FunctionJob] | None = None) -> FunctionJob:
    """``kit.submit`` here, of a call already pickled (``payload``); the job a ``make`` (the face's class)."""
    python = _function_python(kwargs.get("image"))

    def write_payload(prepared: lib.PreparedJob) -> None:
        files.write_atomic(prepared.job_dir / JobDir.FUNCTION, payload, 0o600)

    job = launch_with([python, "-m", "kit.train.function"], kwargs, before_submit=write_payload)
    return (make or FunctionJob)(job.dir, job_id=job.id, messages=job.messages)


def pickled_each(fn: Callable, items: Iterable[Any], kwargs: dict) -> list[bytes]:
    """``fn(item)`` pickled for each item (``kit.map``)."""
    if "array" in kwargs:
        raise KitError(
            "kit.map makes the array itself: one task per item",
            field="--array",
            hint="leave out array=; to run at most K at once, map over fewer items at a time",
        )
    payloads = []
    for item in items:
        try:
            payloads.append(_dumps(fn, (fn, (item,), {})))
        except Exception as e:
            raise KitError(
                f"cannot pickle {getattr(fn, '__name__', fn)!r} with item {len(payloads)}: {e}", field="fn"
            ) from None
    if not payloads:
        raise KitError("no items to map over", field="items")
    return payloads


def map_payloads(payloads: list[bytes], kwargs: dict, make: type[FunctionJob] | None = None) -> list[FunctionJob]:
    """``kit.map`` here, of calls already pickled (one per item); each task's job a ``make``."""
    make = make or FunctionJob
    python = _function_python(kwargs.get("image"))

    def write_payloads(prepared: lib.PreparedJob) -> None:
        for i, payload in enumerate(payloads):
            files.write_atomic(JobDir(prepared.job_dir).task(i) / JobDir.FUNCTION, payload, 0o600)

    job = launch_with(
        [python, "-m", "kit.train.function"],
        {**kwargs, "array": f"0-{len(payloads) - 1}"},
        before_submit=write_payloads,
    )
    if job.id is None:  # a dry run
        return [make(JobDir(job.dir).task(i).path) for i in range(len(payloads))]
    states = slurm.ArrayStates(job.target, job.id, range(len(payloads)))  # one squeue for every task's wait
    return [
        make(JobDir(job.dir).task(i).path, job_id=f"{job.id}_{i}", target=job.target, array_states=states)
        for i in range(len(payloads))
    ]


def _dumps(fn: Callable, call: tuple) -> bytes:
    """``call`` pickled with cloudpickle. A function from a module of the user's own (not
    installed: a script's neighbour, a notebook's helper file, a test) travels by value, as
    ``__main__``'s does: the nodes need not be able to import it."""
    import cloudpickle

    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    file = getattr(module, "__file__", None) or ""
    own = (
        bool(file)
        and module.__name__ != "__main__"
        and not module.__name__.split(".")[0] == "kit"
        and not {"site-packages", "dist-packages"} & set(Path(file).parts)
        and not file.startswith(sys.base_prefix)
    )
    if own:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(call)
    finally:
        if own:
            cloudpickle.unregister_pickle_by_value(module)


def _function_python(image) -> str:
    """The Python a function job runs on: this one, or the image's python3 (checked)."""
    if image is None:
        return sys.executable
    if not is_reference(str(image)):
        check_image_python(Path(os.fspath(image)))
    return "python3"


def check_image_python(image: Path) -> None:
    """The image's python3 is this Python's minor version and can import cloudpickle (read
    from the image's file list: nothing is unpacked); KitError naming what differs."""
    want = "python%d.%d" % sys.version_info[:2]
    listing = info.list_paths(image)
    found = sorted({m.group(1) for p in listing if (m := re.fullmatch(r"usr/(?:local/)?bin/(python3\.\d+)", p))})
    if want not in found:
        raise KitError(
            f"{image} has {', '.join(found) or 'no python3'}, this Python is {want[6:]}",
            field="--image",
            hint="a function job's call is pickled here and unpickled there: use an image with the same "
            "Python minor version (kit build's base decides it)",
        )
    if not any(re.search(r"/(?:site|dist)-packages/cloudpickle/__init__\.py$", p) for p in listing):
        raise KitError(
            f"{image} has no cloudpickle for its {want}",
            field="--image",
            hint='add it to the image (a recipe\'s pip = ["cloudpickle"], or KIT pip cloudpickle)',
        )


def every_rank_returned(job_dir: Path) -> bool:
    """Whether every rank of the job's first run left its return value and none raised: the values are final
    before Slurm sees the job end (the ranks' teardown, srun's return, prelaunch's conclusion). Only the first
    run's (no run concluded yet): after a requeue the values wait for the end, which tells which run they are."""
    job = JobDir(job_dir)
    if (job / JobDir.RUNS).exists() or job.errors():
        return False
    ranks = job.result_ranks()
    if not ranks:
        return False
    spec_dir = records.submission_dir(job_dir)
    try:
        spec = files.read_json(jobdir.own(Path(spec_dir) / JobDir.SPEC), 1 << 22)
        world = int(spec["nodes"]) * int(spec["ntasks_per_node"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return ranks == list(range(world))


def results(job_dir: Path, job_id: str | None, end: Outcome | None) -> list:
    """Every rank's return value from a function job that ended with ``end`` (None: every rank returned,
    :func:`every_rank_returned`), by rank; the first rank that raised (by time) raises RemoteError. Loaded only
    from the caller's own files."""
    return [pickle.loads(data) for data in result_payloads(job_dir, job_id, end)]


RESULT_LIMIT = 1 << 30  # per rank, here
HOSTED_RESULT_LIMIT = 45 << 20  # every rank's together, for a laptop: base64 of it fits one wire record


def result_payloads(job_dir: Path, job_id: str | None, end: Outcome | None, limit: int | None = None) -> list[bytes]:
    """:func:`results` still pickled (a login node hands them to the laptop that submitted the call,
    unpickling nothing of the user's itself): only the files the job's own ranks wrote in its own results
    directory (regular, not links, the caller's, no one else's to write), every rank's, together at most
    ``limit`` bytes (a laptop's :data:`HOSTED_RESULT_LIMIT`)."""
    jobdir.own(job_dir)
    job = JobDir(job_dir)
    errors = sorted((p for p in job.errors()), key=lambda p: p.stat().st_mtime)
    if errors:
        try:
            record = files.loads(jobdir.read_own(errors[0], 1 << 20))
        except ValueError:
            record = None
        if not isinstance(record, dict):
            raise KitError(f"{errors[0]}: not the record a rank writes", field="JOB", exit_code=1)
        raise RemoteError(record)
    ranks = job.result_ranks()
    if (end is not None and end.exit_code != 0) or not ranks or ranks != list(range(len(ranks))):
        raise KitError(
            f"job {job_id} {end.describe() if end else 'is running'}: no result from every rank",
            field="JOB",
            exit_code=1,
            hint=f"kit logs {job_dir} --errors",
        )
    out, left = [], RESULT_LIMIT if limit is None else limit
    for rank in ranks:
        out.append(jobdir.read_own(job.result(rank), min(left, RESULT_LIMIT)))
        left -= len(out[-1])
    return out


PYTHON = "%d.%d" % sys.version_info[:2]


def _results_here(job: FunctionJob, timeout: float | None) -> list:
    """A function job's values from its login node; a kit.map task's call brings with it those of every task
    that has ended by then (each read once), so a loop over the tasks makes a call per batch, not per task."""
    index = job.id.rpartition("_")[2]
    record = job.batch.get(index) if job.batch is not None else None
    if record is None:
        record = job.there.call("results", job._address(), {"timeout": timeout, "batch": job.batch is not None})
        tasks = record.get("tasks") if isinstance(record, dict) else None
        if isinstance(tasks, dict) and job.batch is not None:
            job.batch.update(tasks)
        record = tasks.get(index) if isinstance(tasks, dict) else record
    results = record.get("results") if isinstance(record, dict) else None
    well_formed = isinstance(results, list) and all(isinstance(r, str) for r in results)
    if not isinstance(record, dict) or not ({"error", "kit_error"} & record.keys() or well_formed):
        raise KitError(
            f"the login node's answer holds no result of job {job.id}",
            field="JOB",
            exit_code=1,
            hint="the login node's kit may be of another version: pip install the same kit there",
        )
    if "error" in record:
        raise RemoteError(record["error"])
    if "kit_error" in record:
        raise KitError(record["kit_error"], field="JOB", exit_code=1, hint=record.get("hint"))
    return [pickle.loads(base64.b64decode(data)) for data in record["results"]]


def _results_there(job: FunctionJob, args: dict) -> dict:
    """The login node's side of a hosted function job's results(): waits here for every rank's value (or the
    job's end), then hands the ranks' pickled values to the laptop (nothing of the user's is unpickled here).
    ``batch`` (kit.map's tasks): with them, by index, those of the array's other tasks that have ended too,
    their states asked for in one query, so that ``[j.result() for j in jobs]`` makes a call per batch, not per
    task."""
    array_id, _, index = job._submitted().partition("_")
    array_dir = job.dir.parent.parent
    states, indices = None, records.task_indices(array_dir) if args.get("batch") and index.isdigit() else []
    if indices:
        states = slurm.ArrayStates(job.target, array_id, indices)
        job = FunctionJob(job.dir, job_id=job.id, target=job.target, array_states=states)
    try:
        end = job.wait(args.get("timeout"), until=lambda: every_rank_returned(job.dir))
    except KitError as e:
        return {"kit_error": e.message, "hint": e.hint}
    record = _result_record(job.dir, job.id, end)
    if states is None:
        return record
    pending = [i for i in states.indices if i not in states.done]
    if pending:
        states.status(pending[0], poll=0)  # one query for every task not yet seen ended
    tasks = {index: record}
    for i in sorted(states.done - {int(index)}):
        task = JobDir(array_dir).task(i).path
        tasks[str(i)] = _result_record(task, f"{array_id}_{i}", settle.observe(states.known[i], task))
    return {"tasks": tasks}


def _result_record(job_dir: Path, job_id: str, end) -> dict:
    try:
        data = result_payloads(job_dir, job_id, end, limit=HOSTED_RESULT_LIMIT)
    except RemoteError as e:
        return {"error": e.record}
    except KitError as e:
        return {"kit_error": e.message, "hint": e.hint}
    return {"results": [base64.b64encode(d).decode() for d in data]}
