"""A submitted job's directory, read back: its submission (id, spec, name, the array it belongs to) and its runs
and ranks. How it ended is :mod:`kit.jobdir.end_records`; how far its training got :mod:`kit.jobdir.trained`; the user's
index of jobs :mod:`kit.jobdir.job_index`.

Scheduler-neutral: it reads only what kit's scripts write into the job
directory, through the names :class:`kit.jobdir.JobDir` gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kit import files
from kit.errors import KitError
from kit.jobdir import JobDir, read_task_record


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


def submitted_id(job_dir: Path) -> str:
    """The job's Slurm id; KitError when the directory's job was never submitted (a dry run's)."""
    job_id = job_id_of(job_dir)
    if job_id is None:
        raise KitError(
            f"{job_dir} was never submitted (no job_id in it)",
            field="JOB",
            hint="a --dry-run writes the directory only",
        )
    return job_id


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
