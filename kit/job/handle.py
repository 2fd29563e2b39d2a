"""A kit job's handle and the launch itself, here: the local bodies of what `kit launch`, `kit ps`, `kit logs`,
`kit cancel` and `kit report` do, as functions and the :class:`Job` methods (as submitit and NeMo-Run users drive
jobs). The public face — ``kit.launch``, ``kit.Job``, ``kit.jobs`` with ``host=`` too — is :mod:`kit.api`; a method
marked hosted (:mod:`kit.job.hosting`) is also callable for a job on a login node, through the transport the face
hands it (``job.there``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from kit import files, slurm, targets
from kit import submission as lib
from kit.core import keywords, options
from kit.core import spec as specs
from kit.core.outcome import Outcome
from kit.errors import KitError
from kit.job import settle, sides
from kit.job.cancel import cancel
from kit.job.hosting import data, hosted
from kit.job.reading import Reading
from kit.jobdir import JobDir, end_records, records, trained

if TYPE_CHECKING:
    from kit.job import listing
    from kit.job.hosting import There

__all__ = ["Job", "cancel", "jobs", "launch_with", "python_names", "rerun", "submit_spec"]

python_names = keywords.python_names


def launch_with(command, kwargs: dict, before_submit=None, make: type[Job] | None = None) -> Job:
    """``kit.launch`` here, its keywords as a dict; ``before_submit`` (see :func:`submit_spec`); the job a
    ``make`` (the face's class: :class:`Job` by default)."""
    request = keywords.request(command, kwargs)
    spec, origins = request.spec()
    plan, prepared = submit_spec(
        spec, origins, where=request.where, dry_run=request.dry_run, before_submit=before_submit
    )
    job = (make or Job)(prepared.job_dir, job_id=prepared.job_id, target=plan.target, messages=plan.messages)
    if request.wait and not request.dry_run:
        job.wait()
    return job


def submit_spec(
    spec: specs.JobSpec,
    origins: specs.Origins,
    *,
    where: str | None = None,
    dry_run: bool = False,
    say=lambda message: None,
    before_submit=None,
    cwd: Path | None = None,
    rerun: lib.Rerun | None = None,
) -> tuple[lib.Plan, lib.PreparedJob]:
    """The launch itself, for `kit launch` and :func:`launch` alike: the target chosen, the
    job planned (resolved and checked once; ``cwd``: where the command starts, ``rerun``:
    what a rerun keeps), ``say`` told its warnings and notes, the job directory written,
    ``before_submit(prepared)`` given it to add to (on failure the directory goes), and
    (unless ``dry_run``) submitted."""
    plan = targets.plan(spec, origins, where=where, dry_run=dry_run, cwd=cwd, rerun=rerun)
    prepared = lib.prepare(plan.job, dry_run=dry_run)
    if before_submit is not None:
        try:
            before_submit(prepared)
        except BaseException:
            files.remove_tree(prepared.job_dir)
            raise
    for message in plan.messages:  # once the job is written: an error is the one thing a failed launch says
        say(message)
    if not dry_run:
        lib.submit(prepared, plan.target)
    return plan, prepared


def rerun(
    job_dir: str | Path,
    edits: dict[str, Any] | Iterable[str] = (),
    *,
    wait: bool = False,
    make: type[Job] | None = None,
) -> Job:
    """A new job with ``job_dir``'s resolved spec (its ``job.json``), in a new directory under
    the same output directory, submitted to the same Slurm; ``edits`` change fields first
    (``{"nodes": 4}``, or ``["nodes=4", "time=\"1:00:00\""]`` as TOML values, as a job file
    writes them). The new job records which job it reruns (``rerun_of.json``)."""
    from kit.job import respec

    again = respec.again(job_dir, edits)
    _, prepared = submit_spec(
        again.spec,
        again.origins,
        where=again.where,
        cwd=again.cwd,
        rerun=again.rerun,
        before_submit=again.before_submit,
    )
    job = (make or Job)(prepared.job_dir, job_id=prepared.job_id)
    if wait:
        job.wait()
    return job


def jobs(
    *, output_dirs: Iterable[str | Path] | None = None, everything: bool = False, make: type[Job] | None = None
) -> list[Job]:
    """The jobs `kit ps` lists here, newest first (an array job's tasks each as a Job)."""
    from kit.job import listing

    output_dirs = (options.OUTPUT_DIR,) if output_dirs is None else output_dirs
    rows = listing.list_jobs([Path(d) for d in output_dirs], everything=everything)
    out = []
    for row in rows:
        array_id, sep, task = row.id.partition("_")
        unit = JobDir(row.job_dir).task(int(task)).path if sep and task.isdigit() else Path(row.job_dir)
        out.append((make or Job)(unit, job_id=row.id, row=row))
    return out


class Job(Reading):
    """A submitted kit job (or one task of an array job), reopened from its directory. ``there``: the transport
    to the login node the job is on (:mod:`kit.api` makes it from ``host=``); each hosted method is then one call
    there."""

    def __init__(
        self,
        job_dir: str | Path,
        *,
        job_id: str | None = None,
        target: slurm.Target | None = None,
        messages: Iterable[str] = (),
        array_states: slurm.ArrayStates | None = None,
        row: listing.JobRow | None = None,
        there: There | None = None,
    ):
        self.there = there
        self.dir, self._target, self._array_states = Path(job_dir), target, array_states  # states: kit.map's
        self.row = row  # what kit.jobs() saw of it (kit ps's row: state, run, step, loss, ...), else None
        self.id = job_id if job_id or there is not None else records.job_id_of(self.dir)
        self.messages = list(messages)  # what `kit launch` would have printed (warnings, notes)

    @classmethod
    def from_dir(cls, job_dir: str | Path, **where: Any) -> Job:
        """The job in ``job_dir`` (a job directory, or an array task's ``tasks/<i>``)."""
        if not where and not Path(job_dir).is_dir():
            raise KitError(f"no such job directory: {job_dir}", field="JOB")
        return cls(job_dir, **where)

    def _like(self, job_dir: str | Path, job_id: str | None, target: slurm.Target | None = None) -> Job:
        """Another job where this one is (a rerun of it), of its kind."""
        return type(self)(job_dir, job_id=job_id, target=target)

    def _address(self) -> dict:
        """The job as a hosted call names it to its login node."""
        return {"dir": str(self.dir), "id": self.id}

    def __repr__(self) -> str:
        there = f", host={self.there.name!r}" if self.there is not None else ""
        return f"kit.Job({self.id or 'not submitted'}, {str(self.dir)!r}{there})"

    @property
    def target(self) -> slurm.Target:
        """The Slurm the job went to (on a login node: its ``conf`` is a path there)."""
        if self._target is None:
            self._target = self._where()
        return self._target

    @hosted(name="target", **data(slurm.Target))
    def _where(self) -> slurm.Target:
        return targets.target_of(self.dir)

    def _submitted(self) -> str:
        if self.id is None:
            if not self.dir.is_dir():
                raise KitError(f"no such job directory: {self.dir}", field="JOB")
            self.id = records.submitted_id(self.dir)
        return self.id

    @hosted(**sides.STATE)
    def state(self) -> str:
        """Slurm's state (PENDING, RUNNING, COMPLETED, ...), or the job directory's once Slurm forgot it;
        a held job's is ``PENDING`` whose ``.note`` (and repr) says it is held and how to release it."""
        st = slurm.statuses(self.target, [self._submitted()]).get(self.id)
        if st is None or st.state == "GONE":
            return end_records.recorded_state(self.dir)
        return slurm.State(st.state, st.shown() if st.held else "")

    def done(self) -> bool:
        return self.state() in slurm.TERMINAL_STATES | {"ENDED"}

    @hosted(**data(trained.Progress))
    def progress(self) -> trained.Progress:
        """The training's latest step, loss and samples/s (what `kit ps` shows)."""
        return trained.training_progress(self.dir)

    @hosted(**data(Outcome), laptop=sides.wait_here)
    def wait(
        self,
        timeout: float | None = None,
        poll: float = 1.0,
        *,
        on_state=None,
        on_outage=None,
        on_poll=None,
        until=None,
    ) -> Outcome | None:
        """Block until the job ends (through requeues and controller outages); its outcome,
        as `kit launch --wait` tells it (which calls this, with ``on_state``/``on_outage``/``on_poll``
        to print as it goes). KitError when ``timeout`` seconds pass first. ``until``: a cheap check
        of the caller's own; once it holds, None (the job may still run)."""
        states, index = self._array_states, self._submitted().rpartition("_")[2]
        end = slurm.wait(
            self.target,
            self.id,
            poll=poll,
            timeout=timeout,
            on_state=on_state,
            on_outage=on_outage,
            on_poll=on_poll,
            status=(lambda: states.status(int(index), poll)) if states else None,
            until=until,
        )
        return None if end is None else settle.observe(end, self.dir)

    def __await__(self):
        import asyncio  # (not at import: kit launch pays for no event loop)

        return asyncio.get_running_loop().run_in_executor(None, self.wait).__await__()

    @hosted()
    def cancel(self, reason: str | None = None) -> dict:
        """Cancel it as `kit cancel` does; the cancel record."""
        self._submitted()
        return cancel(self.dir, reason)

    @hosted()
    def logs(
        self,
        rank: int | None = None,
        run: int | None = None,
        errors: bool = False,
        *,
        node: str | None = None,
        sidecar: str | None = None,
    ) -> str:
        """A run's rank logs (all ranks, each line prefixed ``R: ``, or one rank's; ``node``: that
        node's ranks; ``sidecar``: a sidecar's log); with ``errors``, per run the first rank that failed
        by itself and its last lines. `kit logs` prints the same, streamed (:meth:`feed_logs`)."""
        if errors:
            return "\n".join(self.errors([run] if run is not None else None))
        parts: list[bytes] = []
        self.feed_logs(
            parts.append,
            rank=rank,
            run=run,
            node=node,
            sidecar=sidecar,
            batch_instead=False,
            prefixed=rank is None and node is None and sidecar is None or None,
        )
        return b"".join(parts).decode(errors="replace")

    @hosted(serve=sides.feed_logs_there, laptop=sides.feed_logs_here)
    def feed_logs(
        self,
        write,
        *,
        rank: int | None = None,
        run: int | None = None,
        node: str | None = None,
        sidecar: str | None = None,
        prefixed: bool | None = None,
        batch_instead: bool = True,
        say=lambda note: None,
    ) -> None:
        """The logs :meth:`logs` means, fed to ``write`` a chunk (bytes) at a time; ``say`` hears first
        what the reader should know (the batch log stands in for ranks that left none, with
        ``batch_instead``: see :func:`kit.job.logs.select`)."""
        from kit.job import logs as joblogs

        selection = joblogs.select(self.dir, rank, node, run, sidecar, prefixed, batch_instead)
        if selection.note:
            say(selection.note)
        joblogs.feed(selection, write)

    @hosted()
    def errors(self, runs: list[int] | None = None) -> list[str]:
        """Per run (every run, or ``runs``), the first rank that failed by itself: a headline and its
        log's last lines (a log of gigabytes is read from its end)."""
        from kit.job import logs as joblogs

        return list(joblogs.errors(self.dir, runs))

    @hosted(serve=sides.no_call, laptop=sides.follow_here)
    def follow(self, write, on_outage=lambda message: None) -> str:
        """Feed the batch logs to ``write`` as they grow, every run, until the job has ended; how it ended."""
        from kit.job import logs as joblogs

        return joblogs.follow(self.dir, self._submitted(), write, on_outage)

    @hosted(encode=sides.made, laptop=sides.rerun_here)
    def rerun(self, *items: str, wait: bool = False, **edits: Any) -> Job:
        """A new job with this one's resolved spec, ``edits`` applied (``nodes=4``; or ``items`` as
        `kit rerun --edit` takes them: ``"nodes=4"``), of this one's kind (a :class:`kit.FunctionJob`'s
        rerun is one)."""
        if items and edits:
            raise KitError("give the edits as KEY=VALUE strings or as keywords, not both", field="--edit")
        job = rerun(self.dir, list(items) if items else edits)
        job = self._like(job.dir, job.id, job._target)
        if wait:
            job.wait()
        return job

    def result(self, timeout: float | None = None) -> Any:
        """A function job's results are :class:`kit.FunctionJob`'s (``kit.FunctionJob.from_dir(d)``)."""
        raise KitError(
            f"{self.dir}: a kit.Job has no return value; open a function job (kit.submit, kit.map) as kit.FunctionJob",
            field="JOB",
            hint=f"kit.FunctionJob.from_dir({str(self.dir)!r}).result()",
        )

    results = result
