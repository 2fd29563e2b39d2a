"""kit from Python: the one face, here or on a login node (``host=``).

    import kit
    job = kit.launch(["python", "-m", "kit.train", "--max-steps", "100"], nodes=2, local=True)
    job.progress()             # step, loss, samples/s
    end = job.wait()           # Outcome: state, exit_code, meaning (docs/endings.md's table)

Every `kit launch` option is a keyword under its command-line name, dashes as underscores (``--output-dir`` ->
``output_dir=``, ``--no-exporter`` -> ``no_exporter=True``, ``--local`` -> ``local=True``, ``--env`` ->
``env={"K": "v"}``, ``--mount`` -> ``mount=["/data:/data"]``); the same checks run and a bad value raises
:class:`kit.KitError` with the command's message (``error.field``, ``error.hint``).

``host=`` (a name ssh knows): the call made on that login node through the system's OpenSSH, the job there.
This module is the one place that knows it: the bodies are kit.job's (:mod:`kit.job.handle`,
:mod:`kit.job.functions`), and a job on a login node carries the transport (:mod:`kit.remote.there`) its
methods call through (:mod:`kit.job.hosting`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from kit.core import options
from kit.core.outcome import Outcome
from kit.errors import KitError
from kit.job import functions, handle
from kit.job.functions import RemoteError

if TYPE_CHECKING:
    from kit import slurm
    from kit.job import listing
    from kit.remote import ssh
    from kit.remote.there import There

__all__ = ["FunctionJob", "Job", "Outcome", "RemoteError", "jobs", "launch", "map", "rerun", "submit"]


def _there(host: "str | ssh.Host | There") -> There:
    """The transport to ``host`` (loaded only then: a local call loads no ssh machinery)."""
    from kit.remote.there import There

    return host if isinstance(host, There) else There.of(host)


class Job(handle.Job):
    """A submitted kit job (or one task of an array job), reopened from its directory; with ``host=``, one on
    that login node (``dir`` is its directory there): the same methods, each one call there."""

    def __init__(
        self,
        job_dir: str | Path,
        *,
        host: "str | ssh.Host | There | None" = None,
        job_id: str | None = None,
        target: slurm.Target | None = None,
        messages: Iterable[str] = (),
        array_states: slurm.ArrayStates | None = None,
        row: listing.JobRow | None = None,
    ):
        there = None if host is None else _there(host)
        if there is not None and (target is not None or array_states is not None):
            raise KitError("a job on a login node has its Slurm there: no target= or array_states=", field="host")
        super().__init__(
            job_dir, job_id=job_id, target=target, messages=messages, array_states=array_states, row=row, there=there
        )

    @classmethod
    def from_dir(cls, job_dir: str | Path, *, host: "str | ssh.Host | None" = None) -> Job:
        """The job in ``job_dir`` (a job directory, or an array task's ``tasks/<i>``; on ``host``: there)."""
        return super().from_dir(job_dir, **({"host": host} if host is not None else {}))

    @property
    def host(self) -> ssh.Host | None:
        """The login node the job is on (None: here)."""
        return None if self.there is None else self.there.host

    def _like(self, job_dir: str | Path, job_id: str | None, target: slurm.Target | None = None) -> Job:
        if self.there is None:
            return super()._like(job_dir, job_id, target)
        return type(self)(job_dir, host=self.there, job_id=job_id)


class FunctionJob(functions.FunctionJob, Job):
    """A function job (:func:`submit`, one task of :func:`map`): a :class:`kit.Job` whose ranks leave return
    values. ``kit.FunctionJob(job_dir)`` reopens one from its directory."""


def launch(command: list[str] | str | None = None, *, host: str | None = None, **kwargs: Any) -> Job:
    """Submit ``command`` (a list of words; a string is run by ``bash -c``) as `kit launch` does, with the same
    options and checks; returns its :class:`Job` (not submitted: ``dry_run=True``; ``wait=True``: after its end).
    ``json`` and ``parsable`` shape what the command prints and change nothing here. ``host``: launched on that
    login node, this directory's code sent there (the job, a :class:`Job`, is there)."""
    if host is None:
        return handle.launch_with(command, kwargs, make=Job)
    there = _there(host)
    job_id, job_dir, messages = there.launch(command, kwargs)
    job = Job(job_dir, host=there, job_id=job_id, messages=messages)
    if kwargs.get("wait") and job_id is not None:
        job.wait()
    return job


def jobs(
    *, output_dirs: Iterable[str | Path] | None = None, everything: bool = False, host: str | None = None
) -> list[Job]:
    """The jobs `kit ps` lists, newest first (an array job's tasks each as a Job); ``host``: on that login
    node (relative output directories under its home; by default ``~/kit-jobs``, where launches from here
    go)."""
    from kit.job import listing

    if host is None:
        return handle.jobs(output_dirs=output_dirs, everything=everything, make=Job)
    there = _there(host)
    dirs = [str(d) for d in (output_dirs or (options.OUTPUT_DIR,))]
    return [
        Job(unit, host=there, job_id=row["id"], row=listing.JobRow.from_json(row))
        for unit, row in there.call("jobs", None, {"output_dirs": dirs, "everything": everything})
    ]


def rerun(job_dir: str | Path, edits: dict[str, Any] | Iterable[str] = (), *, wait: bool = False) -> Job:
    """A new job with ``job_dir``'s resolved spec (its ``job.json``), in a new directory under the same output
    directory, submitted to the same Slurm; ``edits`` change fields first (``{"nodes": 4}``, or ``["nodes=4",
    "time=\\"1:00:00\\""]`` as TOML values, as a job file writes them). The new job records which job it reruns
    (``rerun_of.json``)."""
    return handle.rerun(job_dir, edits, wait=wait, make=Job)


def submit(fn: Callable, *args: Any, host: str | None = None, **kwargs: Any) -> FunctionJob:
    """Run ``fn(*args)`` on every rank of a job (``nodes=``, ``ntasks_per_node=``, ``image=`` and every other
    `kit launch` option as in :func:`launch`), with the launcher's variables set; ``job.result()`` is rank 0's
    return value, ``job.results()`` every rank's. The call is pickled with cloudpickle into the job directory;
    the job's Python (this one, or the image's python3) must be the same minor version and have cloudpickle:
    checked first. ``host=``: submitted from here to that login node through ssh: the call is pickled here, its
    Python there must be this one's minor version (refused before anything is sent), and ``result()`` brings the
    value back.

    Trust: a result is a pickle, and unpickling runs code. kit loads one only from a file the job's own rank
    wrote in the job's own ``results/`` directory — a regular file (never a link) of the caller's that no one
    else can write, the job ended with every rank's — and refuses any other. With ``host=`` the laptop
    unpickles what the login account sends (at most 45 MiB together): whoever can act as that account (a
    teammate sharing it, a program it runs, the kit installed there) can run code on the laptop through a
    result, as they can through its jobs. Use ``host=`` with a login account that is yours alone."""
    payload = functions.pickled(fn, args)
    if host is None:
        return functions.submit_payload(payload, kwargs, make=FunctionJob)
    return _submitted_there(_there(host), [payload], kwargs, array=False)[0]


def map(fn: Callable, items: Iterable[Any], host: str | None = None, **kwargs: Any) -> list[FunctionJob]:
    """``fn(item)`` for each item, as one Slurm array job (a task per item, each its own unit of work: own
    directory, requeue and port; every `kit launch` option as in :func:`launch`, ``nodes=`` per task). Returns a
    Job per task, in the items' order: ``[j.result() for j in jobs]``. ``host=``: from here to that login node,
    as :func:`submit` does."""
    payloads = functions.pickled_each(fn, items, kwargs)
    if host is None:
        return functions.map_payloads(payloads, kwargs, make=FunctionJob)
    return _submitted_there(_there(host), payloads, kwargs, array=True)


def _submitted_there(there: There, payloads: list[bytes], kwargs: dict, array: bool) -> list[FunctionJob]:
    jobs = [
        FunctionJob(job_dir, host=there, job_id=job_id) for job_id, job_dir in there.submit(payloads, kwargs, array)
    ]
    if array:
        shared: dict[str, dict] = {}  # the tasks' results as they come, by index (one call brings a batch)
        for job in jobs:
            job.batch = shared
    return jobs
