"""A job's state as Slurm tells it (squeue, then scontrol's record of an ended job), and waiting for an end
through controller outages; what an end means is :mod:`kit.slurm.ends`'s."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from kit.core import outcome
from kit.core import sweep as sweep_lib
from kit.errors import KitError
from kit.slurm.target import TERMINAL_STATES, Target


@dataclass
class JobStatus:
    """One job as Slurm reports it (``squeue --json``: no user string can fake a field)."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, ...; GONE once Slurm has forgotten the job
    exit_code: int = 0  # the batch script's, as a shell reports it (128+N when killed by signal N)
    restarts: int = 0
    requeue: bool = False
    nodes: str = ""
    reason: str = ""
    start_time: int = 0
    end_time: int = 0
    excluded_nodes: str = ""
    dependency: str = ""
    detail: str = ""  # Slurm's longer word on the reason (squeue's %R: "ReqNodeNotAvail, UnavailableNodes:node2")
    user_id: int | None = None  # whose job it is

    @property
    def held(self) -> bool:
        """Pending because someone held it (``--hold``, ``scontrol hold``): it never starts by itself."""
        return self.state == "PENDING" and self.reason in HELD_REASONS

    def shown(self) -> str:
        """The state as a user should read it: a held job says so, and how to release it."""
        if self.held:
            return (
                f"PENDING, held ({self.reason}): it never starts by itself; release it with "
                f"`scontrol release {self.job_id}`"
            )
        return self.state


HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})


class State(str):
    """A job's state, equal to Slurm's word; ``note`` says more where a user must act (held)."""

    note: str

    def __new__(cls, state: str, note: str = ""):
        self = super().__new__(cls, state)
        self.note = note
        return self

    def __repr__(self) -> str:
        return f"{str.__repr__(self)} ({self.note})" if self.note else str.__repr__(self)


class ControllerUnreachable(KitError):
    """slurmctld did not answer (down, restarting, or the network)."""


_UNREACHABLE = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Zero Bytes were transmitted",
)


def _wait_status(raw: int) -> int:
    """A raw wait status (what Slurm stores) as a shell reports it."""
    return 128 + (raw & 0x7F) if raw & 0x7F else (raw >> 8) & 0xFF


BUSY_PATIENCE = 30.0  # seconds a one-off question asks a controller that did not answer again (0: a wait's own)
BUSY_PAUSE = 2.0


def _squeue_jobs(target: Target, patience: float) -> list[dict]:
    """Every job record ``squeue --json`` prints (Slurm 22.05's ``--json`` ignores ``--jobs`` and the other
    filters: callers pick their jobs). A controller that does not answer (squeue waits MessageTimeout, 10 s by
    default: a busy slurmctld can take longer) is asked again for up to ``patience`` seconds."""
    since = time.monotonic()
    while True:
        try:
            return _squeue_once(target)
        except ControllerUnreachable:
            if time.monotonic() - since + BUSY_PAUSE > patience:
                raise
            time.sleep(BUSY_PAUSE)


def _squeue_once(target: Target) -> list[dict]:
    proc = target.run(["squeue", "--json"], check=False, timeout=60)
    if proc.returncode != 0:
        if any(m in proc.stderr for m in _UNREACHABLE):
            raise ControllerUnreachable("slurmctld is not answering", detail=proc.stderr.strip(), exit_code=1)
        raise KitError("squeue --json failed", detail=proc.stderr.strip(), exit_code=1)
    try:
        data = json.loads(proc.stdout)
        jobs, errors = data["jobs"], data.get("errors") or []
    except (ValueError, KeyError, TypeError):
        raise KitError(
            "squeue --json printed no job list",
            detail=proc.stdout[:2000],
            exit_code=1,
            hint="kit reads job states with squeue --json (Slurm 21.08 or newer)",
        ) from None
    if errors:
        # A controller that does not answer gives exit 0, no jobs and this list.
        raise ControllerUnreachable(
            "squeue could not load jobs", exit_code=1, detail="; ".join(str(e.get("description") or e) for e in errors)
        )
    return [j for j in jobs if isinstance(j, dict)]


def _status_of(target: Target, j: dict, name: str) -> JobStatus:
    state = str(j.get("job_state") or "UNKNOWN")
    if state in TERMINAL_STATES and _completing(target, str(j.get("job_id"))):
        state = "COMPLETING"  # JSON shows the end state while processes are still being killed
    return JobStatus(
        job_id=name,
        state=state,
        exit_code=_wait_status(int(j.get("exit_code") or 0)),
        restarts=int(j.get("restart_cnt") or 0),
        requeue=bool(j.get("requeue")),
        nodes=str(j.get("nodes") or ""),
        reason=str(j.get("state_reason") or ""),
        detail=str(j.get("state_description") or ""),
        start_time=int(j.get("start_time") or 0),
        end_time=int(j.get("end_time") or 0),
        excluded_nodes=str(j.get("excluded_nodes") or ""),
        dependency=str(j.get("dependency") or ""),
        user_id=j["user_id"] if isinstance(j.get("user_id"), int) else None,
    )


def _by_name(found: list[dict]) -> dict[str, dict]:
    """Job records by the names kit uses: ``ID``, and ``ID_TASK`` for an array
    task (pending tasks share one record whose ``array_task_string`` lists
    them); an array task's own job id names it too."""
    out: dict[str, dict] = {}
    for j in found:
        array_id, task = j.get("array_job_id"), j.get("array_task_id")
        if array_id and isinstance(task, int) and not isinstance(task, bool):
            out[f"{array_id}_{task}"] = j
        pending = str(j.get("array_task_string") or "").partition("%")[0]
        if array_id and pending and task is None:
            for i in sweep_lib.parse_tasks(pending, "squeue").indices:
                out[f"{array_id}_{i}"] = j
    for j in found:  # plain ids last: never in place of a task's name
        out.setdefault(str(j.get("job_id")), j)
    return out


def statuses(target: Target, names: Iterable[str], patience: float = BUSY_PATIENCE) -> dict[str, JobStatus]:
    """Several jobs' states from one ``squeue --json``: each name is a job id or an array task's ``ID_TASK``;
    GONE for a job Slurm has forgotten. ``patience``: how long a controller that does not answer is asked
    again (a wait's checks: 0, :func:`follow` rides an outage itself and says so)."""
    records = _by_name(_squeue_jobs(target, patience))
    return {n: _status_of(target, records[n], n) if n in records else JobStatus(job_id=n, state="GONE") for n in names}


def job_status(target: Target, job_id: str, patience: float = BUSY_PATIENCE) -> JobStatus:
    """The job's state from ``squeue --json``; state GONE once Slurm has forgotten it."""
    return statuses(target, [job_id], patience)[job_id]


def array_status(
    target: Target, array_id: str, indices: Iterable[int], patience: float = BUSY_PATIENCE
) -> dict[int, JobStatus]:
    """Each task of an array job (``ARRAY_INDEX`` names it); GONE once Slurm forgot it."""
    indices = list(indices)
    found = statuses(target, [f"{array_id}_{i}" for i in indices], patience)
    return {i: found[f"{array_id}_{i}"] for i in indices}


def _completing(target: Target, job_id: str) -> bool:
    """Is the job still COMPLETING (squeue's one-word state: nothing user-made can fake it)?"""
    proc = target.run(
        ["squeue", "--noheader", f"--jobs={job_id}", "--states=all", "--format=%T"], check=False, timeout=60
    )
    return proc.returncode == 0 and proc.stdout.strip() == "COMPLETING"


# States from which Slurm may still requeue the job by itself (a job with
# --requeue): seen at the end of a run, they must hold a while to be final.
SETTLING_STATES = frozenset({"NODE_FAIL", "PREEMPTED", "BOOT_FAIL"})


class _Final:
    """Whether a status is final: terminal, and held ``settle`` seconds in a
    state Slurm may still requeue from (a job with --requeue)."""

    def __init__(self, settle: float):
        self.settle = settle
        self.since: dict = {}

    def __call__(self, key, st: JobStatus) -> bool:
        if st.state in TERMINAL_STATES or st.state == "GONE":
            if not (st.state in SETTLING_STATES and st.requeue):
                return True
            return time.monotonic() - self.since.setdefault(key, time.monotonic()) >= self.settle
        self.since.pop(key, None)
        return False


FIRST_PAUSE = 0.05  # a wait's first pause: a short job's end is seen at once


def _pauses(poll: float):
    """The pauses between a wait's checks: ``FIRST_PAUSE``, doubling up to ``poll`` (a long job is asked every
    ``poll`` seconds, a few checks more in its first second; a job that ends in 2 s is seen within 0.2 s, not 1 s)."""
    pause = min(FIRST_PAUSE, poll)
    while True:
        yield pause
        pause = min(2 * pause, poll)


def follow(
    check: Callable[[], object],
    *,
    what: str,
    poll: float,
    timeout: float | None,
    outage: float,
    on_outage: Callable[[str], None] | None,
    until: Callable[[], bool] | None = None,
):
    """Call ``check`` every ``poll`` seconds until it returns something (None instead, as soon as ``until()``
    holds: a cheap check of the caller's own, made every ``FIRST_PAUSE`` between them). A controller that does
    not answer is asked again for up to ``outage`` seconds (``on_outage`` hears about it once per outage); then
    a KitError."""
    deadline = None if timeout is None else time.monotonic() + timeout
    unreachable_since = None
    pauses = _pauses(poll)
    while True:
        if until is not None and until():
            return None
        try:
            result = check()
        except ControllerUnreachable as e:
            now = time.monotonic()
            if unreachable_since is None:
                unreachable_since = now
                if on_outage:
                    on_outage(f"slurmctld is not answering; still waiting (up to {outage:g} s)")
            elif now - unreachable_since > outage:
                raise KitError(
                    f"slurmctld did not answer for {outage:g} s; {what} may still run",
                    exit_code=outcome.LOST,
                    detail=e.detail,
                    hint="follow it in its job directory, or wait again: kit launch does not "
                    "resubmit; squeue --jobs=ID",
                ) from None
            time.sleep(poll)
            continue
        if unreachable_since is not None:
            unreachable_since = None
            if on_outage:
                on_outage("slurmctld answers again")
        if result is not None:
            return result
        if deadline is not None and time.monotonic() > deadline:
            raise KitError(f"{what} has not ended after {timeout:g} s", exit_code=1)
        _sleep(next(pauses), until)


def _sleep(seconds: float, until: Callable[[], bool] | None) -> None:
    """``seconds``, or less once ``until()`` holds (asked every ``FIRST_PAUSE``)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, FIRST_PAUSE) if until is not None else left)
        if until is not None and until():
            return


def wait(
    target: Target,
    job_id: str,
    *,
    poll: float = 1.0,
    timeout: float | None = None,
    on_state: Callable[[JobStatus], None] | None = None,
    outage: float = 900.0,
    on_outage: Callable[[str], None] | None = None,
    settle: float = 10.0,
    on_poll: Callable[[JobStatus], None] | None = None,
    status: Callable[[], JobStatus] | None = None,
    until: Callable[[], bool] | None = None,
) -> JobStatus | None:
    """Block until the job reaches a final state (requeues and outages are waited through), or None once
    ``until()`` holds first; ``status`` asks for its state (default: one squeue for it)."""
    final = _Final(settle)
    last: list = [None]

    def check():
        st = status() if status else job_status(target, job_id, patience=0)
        if st.shown() != last[0] and on_state:
            on_state(st)
        last[0] = st.shown()
        if on_poll:
            on_poll(st)
        return st if final(job_id, st) else None

    return follow(
        check, what=f"job {job_id}", poll=poll, timeout=timeout, outage=outage, on_outage=on_outage, until=until
    )


class ArrayStates:
    """The states of an array job's tasks, shared by their waiters (kit.map's Jobs): the tasks
    not yet seen final are asked for together, in one squeue, at most once per ``poll``
    seconds; a task seen final is never asked for again."""

    def __init__(self, target: Target, array_id: str, indices: Iterable[int], settle: float = 10.0):
        self.target, self.array_id, self.indices = target, array_id, list(indices)
        self.known: dict[int, JobStatus] = {}
        self.final, self.done, self.at = _Final(settle), set(), None

    def status(self, index: int, poll: float = 1.0) -> JobStatus:
        if index not in self.done and (self.at is None or time.monotonic() - self.at >= poll):
            self.at = time.monotonic()
            self.known.update(
                array_status(self.target, self.array_id, [i for i in self.indices if i not in self.done], patience=0)
            )
            self.done |= {i for i, st in self.known.items() if i not in self.done and self.final(i, st)}
        return self.known[index]


def wait_array(
    target: Target,
    array_id: str,
    indices: Iterable[int],
    *,
    poll: float = 1.0,
    timeout: float | None = None,
    on_state: Callable[[int, JobStatus], None] | None = None,
    outage: float = 900.0,
    on_outage: Callable[[str], None] | None = None,
    settle: float = 10.0,
) -> dict[int, JobStatus]:
    """Block until every task of the array job is final; each task's status by index."""
    final = _Final(settle)
    indices = list(indices)
    last: dict[int, str] = {}

    def check():
        states = array_status(target, array_id, indices, patience=0)
        for i, st in states.items():
            if last.get(i) != st.state and on_state:
                on_state(i, st)
            last[i] = st.state
        done = [final(i, st) for i, st in states.items()]
        return states if all(done) else None

    return follow(check, what=f"array job {array_id}", poll=poll, timeout=timeout, outage=outage, on_outage=on_outage)
