"""A submitted job's directory, read back: which directory a job id names,
its runs, ranks and logs, how each rank ended, and the records the commands keep
(a cancel's, the end Slurm gave, the user's index of jobs).

Scheduler-neutral: it reads only what kit's scripts write into the job
directory, through the names :class:`kit.jobdir.JobDir` gives.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from kit import files, jobdir
from kit.errors import KitError
from kit.jobdir import JobDir, read_task_record
from kit.jobdir.metrics import newest_rank_metrics


def find_job_dir(job: str, output_dir: str | Path) -> Path:
    """``job`` as a job directory, or a job id looked up under ``output_dir``;
    an array task's ``ID_TASK`` names its task directory."""
    job_dir = Path(job)
    if job_dir.is_dir():
        return job_dir
    if "/" in job:  # a path (a job id has none)
        raise KitError(f"no such job directory: {job}", field="JOB")
    array_id, sep, task = job.partition("_")
    if sep and array_id.isdigit() and task.isdigit():
        task_dir = JobDir(find_job_dir(array_id, output_dir)).task(int(task)).path
        if not task_dir.is_dir():
            raise KitError(
                f"job {array_id} has no task {task}", field="JOB", hint="kit ps lists the tasks of an array job"
            )
        return task_dir
    matches = []
    for p in Path(output_dir).glob(f"*/{JobDir.JOB_ID}"):
        try:
            if files.read_text(p, 64).strip() == job:
                matches.append(p.parent)
        except OSError:
            continue
    mine = [m for m in matches if jobdir.owner(m) == os.geteuid()]
    matches = mine or matches  # in a shared output directory anyone may write a directory naming any id
    if not matches:
        raise KitError(
            f"no job directory for job {job} under {output_dir}",
            field="JOB",
            hint="give the job directory itself, or --output-dir where it lives",
        )
    if len(matches) > 1:
        raise KitError(
            f"job id {job} names {len(matches)} job directories under {output_dir}",
            field="JOB",
            detail="\n".join(str(m) for m in sorted(matches)),
            hint="give the job directory itself",
        )
    return matches[0]


def _index_path() -> Path:
    from kit.home import kit_home

    return kit_home() / "jobs.index"


def remember(job_dir: Path) -> None:
    """Add a submitted job's directory to the user's index of jobs (``kit ps``
    reads it): one JSON string per line, appended."""
    path = _index_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.append(path, json.dumps(str(Path(job_dir).resolve())) + "\n", 0o600)
    except OSError:
        pass  # kit ps still finds it with --output-dir


def known_job_dirs(output_dirs: list[Path]) -> list[Path]:
    """Submitted job directories, newest first: those in the index, and those
    under ``output_dirs``."""
    found: dict[Path, float] = {}

    def consider(d: Path) -> None:
        try:
            d = d.resolve()
        except (OSError, RuntimeError):
            return
        when = submitted_at(d)
        if when is not None:  # else gone, or never submitted
            found.setdefault(d, when)

    try:
        lines = files.read_text(_index_path(), 64 << 20).splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            name = files.loads(line)
        except ValueError:
            continue  # a torn line
        if isinstance(name, str) and "\0" not in name:
            consider(Path(name))
    for out in output_dirs:
        for p in Path(out).glob(f"*/{JobDir.JOB_ID}"):
            consider(p.parent)
    return sorted(found, key=lambda d: found[d], reverse=True)


def submitted_at(job_dir: Path) -> float | None:
    """When sbatch returned (the job id's record; an array task's is its array's)."""
    return files.mtime(submission_dir(job_dir) / JobDir.JOB_ID)


def task_indices(job_dir: Path) -> list[int]:
    """An array job's task indices (its ``tasks/<index>/``); [] for a single job."""
    return JobDir(job_dir).task_indices()


@dataclass(frozen=True)
class RunRecord:
    """One line of ``runs.jsonl``: how a run ended. prelaunch's kit::_append_run writes it (json.dumps's
    text, tests/test_bash_rules.py pins the pair); :func:`run_records` is its one parser."""

    run: int
    end: str  # finished, failed, warned, stopped, hang, incomplete, killed, ...
    exit_code: int | None = None  # None: not recorded
    checkpoint_step: int = -1  # at the run's end; -1: the command reports none
    advanced: bool | None = None  # did the checkpoint step advance in the run (None: unknown, a killed run)
    time: int | None = None  # its end (s)
    teardown_exit_code: int | None = None  # a step that failed after its work was finished
    start_ms: int | None = None  # when its batch script began (ms; None: not known, a run caught up after a kill)
    end_ms: int | None = None  # when it ended (ms; a caught-up run's: when the next run caught it up)
    then: str | None = None  # "restart": the next run started in this run's allocation (no requeue)

    @classmethod
    def parse(cls, rec: object) -> RunRecord | None:
        """A record from its JSON value: ``run`` and ``end`` needed, every field of its type (else None)."""
        if not isinstance(rec, dict) or type(rec.get("run")) is not int or not isinstance(rec.get("end"), str):
            return None
        ints = ("exit_code", "checkpoint_step", "time", "teardown_exit_code", "start_ms", "end_ms")
        types = {**dict.fromkeys(ints, int), "advanced": bool, "then": str}
        if any(k in rec and rec[k] is not None and type(rec[k]) is not t for k, t in types.items()):
            return None
        return cls(**{k: rec[k] for k in ("run", "end", *types) if rec.get(k) is not None})


def run_records(job_dir: Path) -> list[RunRecord]:
    """``runs.jsonl``: one record per run, how it ended, in order; torn or damaged lines skipped."""
    try:
        lines = files.read_text(Path(job_dir) / JobDir.RUNS).splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            rec = RunRecord.parse(files.loads(line))
        except ValueError:
            continue
        if rec is not None:
            out.append(rec)
    return out


def last_run(job_dir: Path) -> RunRecord | None:
    """The last record of ``runs.jsonl`` (how the latest run ended), if any."""
    records = run_records(job_dir)
    return records[-1] if records else None


def params(job_dir: Path) -> dict:
    """A sweep task's parameters (``params.json``); {} for any other job."""
    try:
        values = files.read_json(Path(job_dir) / JobDir.PARAMS)
    except (OSError, ValueError):
        return {}
    return values if isinstance(values, dict) else {}


def job_name(job_dir: Path) -> str:
    """The job's name from its spec (``job.json``), else the directory's name."""
    try:
        name = files.read_json(Path(job_dir) / JobDir.SPEC).get("job_name")
    except (OSError, ValueError, AttributeError):
        name = None
    return str(name) if name else Path(job_dir).name


def rerun_of(job_dir: Path) -> str | None:
    """The id of the job this one reruns (``rerun_of.json``), if it is a rerun."""
    try:
        rec = files.read_json(Path(job_dir) / JobDir.RERUN_OF, 1 << 16)
    except (OSError, ValueError):
        return None
    job_id = rec.get("job_id") if isinstance(rec, dict) else None
    return str(job_id) if isinstance(job_id, str) and job_id.replace("_", "").isdigit() else None


def finished(job_dir: Path) -> bool:
    """The FINISHED marker is there (see :func:`work_finished` for what it means)."""
    return (Path(job_dir) / JobDir.FINISHED).exists()


OUTCOME_RECORD = JobDir.OUTCOME


def keep_outcome(job_dir: Path, state: str, told: dict | None = None) -> None:
    """Record the end state Slurm gave the job (``outcome.json``), so that once Slurm
    forgets it kit tells the same end (a requeued job's later end replaces it); with ``told`` (the end as
    ``--wait`` tells it: exit_code, meaning, restarts) that too, for the report. Only in a directory of the
    caller's own."""
    path = Path(job_dir) / OUTCOME_RECORD
    try:
        if os.stat(job_dir).st_uid != os.geteuid():
            return
        try:
            kept = files.read_json(path, 4096)
            if kept.get("state") == state and (told is None or "meaning" in kept):
                return
        except (OSError, ValueError, AttributeError):
            pass
        record = {"state": state, "time": round(time.time(), 3), **(told or {})}
        files.write_atomic(path, json.dumps(record) + "\n")
    except OSError:
        pass  # a read-only or full directory: the end is still told from the rest of it


def kept_outcome(job_dir: Path) -> dict | None:
    """``outcome.json`` as :func:`keep_outcome` writes it (its state a word of Slurm's: A-Z and _), else None."""
    try:
        kept = files.read_json(Path(job_dir) / OUTCOME_RECORD, 4096)
    except (OSError, ValueError):
        return None
    state = kept.get("state") if isinstance(kept, dict) else None
    return kept if isinstance(state, str) and re.fullmatch(r"[A-Z_]{1,20}", state) else None


def recorded_state(job_dir: Path) -> str:
    """A job's end as its directory tells it (for a job the scheduler has
    forgotten): what Slurm said at its end when kit saw it (``outcome.json``);
    else COMPLETED only with the FINISHED marker."""
    kept = kept_outcome(job_dir)
    if kept is not None:
        return kept["state"]
    if finished(job_dir):
        return "COMPLETED" if work_finished(job_dir) else "FAILED"
    if cancelled(job_dir):
        return "CANCELLED"
    last = last_run(job_dir)
    return "FAILED" if last and last.end in ("failed", "hang", "incomplete") else "ENDED"


def work_finished(job_dir: Path) -> bool:
    """The FINISHED marker, and the run that ended with it exited 0: a rank can still
    fail after the trainer marked the work done (Slurm then says FAILED, and so does kit)."""
    if not finished(job_dir):
        return False
    last = last_run(job_dir)
    return last is None or last.exit_code in (0, None)


def array_job_dir(job_dir: Path) -> Path | None:
    """The array job's directory, when ``job_dir`` is one of its task directories."""
    parent = Path(job_dir).parent
    if parent.name == JobDir.TASKS and Path(job_dir).name.isdigit() and (parent.parent / JobDir.JOB_ID).exists():
        return parent.parent
    return None


def submission_dir(job_dir: Path) -> Path:
    """Where the submission's records lie (the job id, the spec, the Slurm target): the job's own directory; an
    array task's array's."""
    return array_job_dir(job_dir) or Path(job_dir)


def job_id_of(job_dir: Path) -> str | None:
    """The job id written at submission; ``ID_TASK`` for an array task's directory."""
    array = array_job_dir(job_dir)
    try:
        text = files.read_text(Path(array or job_dir) / JobDir.JOB_ID, 64).strip()
    except OSError:
        return None
    if not text.isdigit():
        return None
    return f"{text}_{Path(job_dir).name}" if array else text


def runs(job_dir: Path) -> list[int]:
    """The run numbers (restarts) that left rank logs, in order."""
    return sorted({run for run, _, _ in JobDir(job_dir).rank_logs()})


def ranks(job_dir: Path, run: int) -> list[int]:
    return [rank for _, rank, _ in JobDir(job_dir).rank_logs(run)]


def node_of(job_dir: Path, run: int, rank: int) -> str:
    """Where a rank ran (the launcher's ``progress/r<run>/task-<rank>``)."""
    record = read_task_record(JobDir(job_dir).task_record(run, rank))
    return record[0] if record else "?"


CANCEL_RECORD = JobDir.CANCELLED


def record_cancel(job_dir: Path, reason: str | None, tasks: list[int] | None = None) -> dict:
    """Who cancelled the job, when and why, in the job directory (before the
    cancel); for an array job, which ``tasks`` were still to end."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry for this uid
        user = str(os.getuid())
    rec = {"by": user, "host": socket.gethostname(), "time": round(time.time(), 3), "reason": reason or ""}
    if tasks is not None:
        rec["tasks"] = sorted(tasks)
    try:
        files.write_atomic(job_dir / CANCEL_RECORD, json.dumps(rec, indent=2) + "\n")
    except OSError as e:
        raise KitError(
            f"cannot write the cancel record in {job_dir}: {e.strerror}",
            field="JOB",
            exit_code=1,
            hint="nothing was cancelled; scancel still works",
        ) from None
    return rec


def cancelled(job_dir: Path) -> bool:
    """Did ``kit cancel`` end this job, or this task of an array job (one the
    array's record names as still to end)?"""
    if (job_dir / CANCEL_RECORD).exists():
        return True
    array = array_job_dir(job_dir)
    if array is None:
        return False
    try:
        rec = files.read_json(array / CANCEL_RECORD)
    except (OSError, ValueError):
        return (array / CANCEL_RECORD).exists()  # there, but damaged: a cancel happened
    tasks = rec.get("tasks") if isinstance(rec, dict) else None
    return not isinstance(tasks, list) or int(Path(job_dir).name) in tasks


@dataclass
class Progress:
    step: int | None = None
    max_steps: int | None = None
    loss: float | None = None
    samples_per_second: float | None = None  # the job's: every rank of the latest run
    tflops: float | None = None  # rank 0's device: the model's achieved TFLOP/s (kit.train.mfu)
    mfu: float | None = None  # rank 0's device: of its peak (None: n/a, a CPU or an unknown GPU)


def _rank_files(job_dir: Path) -> dict[int, dict]:
    """Each rank's newest metrics values (kit.jobdir.metrics.newest_rank_metrics)."""
    return {rank: values for rank, (_, values) in newest_rank_metrics(job_dir).items()}


def training_progress(job_dir: Path) -> Progress:
    """The job's latest training metrics, from the files kit.train's callback
    writes: step, max steps and loss from rank 0; samples/s summed over the
    ranks that reported within 30 s of rank 0 (the current run's)."""
    files = _rank_files(job_dir)
    zero = files.get(0)
    if zero is None:
        return Progress()
    t0 = zero["last_step_timestamp_seconds"]
    rates = [
        f["samples_per_second"]
        for f in files.values()
        if "samples_per_second" in f and abs(f["last_step_timestamp_seconds"] - t0) <= 30
    ]
    return Progress(
        step=int(zero["step"]) if "step" in zero else None,
        max_steps=int(zero["max_steps"]) if "max_steps" in zero else None,
        loss=zero.get("loss"),
        samples_per_second=sum(rates) if rates else None,
        tflops=zero.get("tflops"),
        mfu=zero.get("mfu"),
    )


def progress_words(p: Progress) -> list[str]:
    """``step 120/3000``, ``loss 0.0312``, ``5120 samples/s``: what is known."""
    words = []
    if p.step is not None:
        words.append(f"step {p.step}" + (f"/{p.max_steps}" if p.max_steps else ""))
    if p.loss is not None:
        words.append(f"loss {p.loss:.4g}")
    if p.samples_per_second is not None:
        words.append(f"{p.samples_per_second:.0f} samples/s")
    if p.tflops is not None:
        words.append(f"{p.tflops:.3g} TFLOP/s/device, MFU " + (f"{100 * p.mfu:.0f}%" if p.mfu is not None else "n/a"))
    return words
