"""A login node as the Python API reaches it: the transport a :class:`kit.Job` with ``host=`` carries.

One call by name (:meth:`There.call`: ``kit remote-call`` over one SSH connection, :mod:`kit.remote.client`: the
user's ssh configuration, kit's shared master), whose name kit there looks up in the one registry of hosted calls
(:mod:`kit.job.hosting`, :func:`kit.remote.server.answer`); a dropped connection ridden through
(:meth:`riding`); a log followed (:meth:`follow`). The face (:mod:`kit.api`) also launches there, the code sent
first (:meth:`launch`), and submits pickled calls (:meth:`submit`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from kit.core import keywords
from kit.errors import KitError
from kit.remote import client, ssh, transfer


class There:
    """The transport to one login node (:class:`kit.job.hosting.There`)."""

    def __init__(self, host: ssh.Host):
        self.host, self.name = host, host.name

    @classmethod
    def of(cls, host: "str | ssh.Host") -> There:
        return cls(host if isinstance(host, ssh.Host) else ssh.Host.of(host))

    def _json(self, value: dict, what: str) -> str:
        try:
            return json.dumps(value)
        except TypeError as e:
            raise KitError(
                f"{what} cannot travel to {self.name}: {e}",
                field="host",
                hint="give plain values (numbers, strings, lists, dicts); paths are the login node's",
            ) from None

    def call(self, name: str, job: dict | None, args: dict) -> Any:
        """``name`` with ``args`` on the login node, of the job at ``job`` (or of none); its value, or its
        KitError here."""
        request = self._json({"call": name, "job": job, "args": args}, "an argument")
        with client.Session(self.host, ["remote-call", request]) as session:
            answer = session.read_json()
        if "kit_error" in answer:
            raise KitError(
                answer["kit_error"],
                field=answer.get("field") or "host",
                hint=answer.get("hint"),
                exit_code=answer.get("exit_code") or 1,
                detail=answer.get("detail"),
            )
        return answer.get("value")

    def riding(self, attempt: Callable[[], Any], note: Callable[[], None]) -> Any:
        return client.riding_through(attempt, note=note)

    def follow(self, job_dir: str, write: Callable[[bytes], Any]) -> None:
        client.run(self.host, ["logs", "-f", job_dir], follow=True, write=write)

    def launch(self, command, kwargs: dict, cwd: Path | None = None) -> tuple[str | None, str, list[str]]:
        """``kit.launch(command, host=, **kwargs)``: checked here as a local launch is, then ``kit launch`` there
        with this directory's code (or ``code=``) sent first: (the job's id (None: a dry run), its directory
        there, what the launch said)."""
        request = keywords.request(command, kwargs)
        made, messages = transfer.launch_call(self.host, request, cwd or Path.cwd())
        return None if kwargs.get("dry_run") else str(made["job_id"]), str(made["job_dir"]), messages

    def submit(self, payloads: list[bytes], kwargs: dict, array: bool) -> list[tuple[str, str]]:
        """The pickled calls (one, or one array task per item) submitted there: (id, directory) of each job.
        ``kit remote-submit`` says its Python first, and the calls go only when it is this one's minor version."""
        from kit.job.functions import PYTHON

        header = self._json({"kwargs": kwargs, "sizes": [len(p) for p in payloads], "map": array}, "a keyword").encode()
        with client.Session(self.host, ["remote-submit"]) as session:
            theirs = session.read_json().get("python")
            if theirs != PYTHON:
                raise KitError(
                    f"the Python of kit on {self.name} is {theirs}, this one is {PYTHON}: the call is "
                    "pickled here and unpickled there",
                    field="host",
                    hint="use the same Python minor version on both sides (nothing was sent)",
                )
            session.send(header + b"\n" + b"".join(payloads))
            made = session.read_json()
        return [(str(job_id), str(job_dir)) for job_id, job_dir in made["jobs"]]
