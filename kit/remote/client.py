"""The laptop's side of ``--host``: ``kit CMD`` run on the login node over :mod:`kit.remote.ssh`.

The command's arguments travel as the first line of the channel's data (``kit remote-args`` reads them), never
on the login node's command line, where every user's ``ps`` would show a ``--env`` secret. kit there refuses a
client of another version before it does anything, answers in records (:mod:`kit.remote.wire`: a login shell's
banner is skipped), and ends when the connection does (its input closes). :func:`run` shows what a command
prints as it comes (``logs -f`` rides through a dropped connection); :class:`Session` is the Python API's
conversation (records both ways).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time

from kit.core.text import Shown
from kit.errors import KitError
from kit.remote import wire
from kit.remote.ssh import FOUND, Host, Unreachable, checked, connection_options, failure, master_alive, ssh_argv

RIDE_THROUGH = 600  # seconds a followed log (or a wait) waits for its connection to come back


def start(host: Host, argv: list[str], options: list[str]) -> subprocess.Popen:
    """``kit ARGV`` on the login node: ssh started, ``argv`` its input's first line (JSON); its input, output
    and stderr pipes, for the caller to go on with — its output through ``proc.stdout``, whose buffer holds what
    came with kit's hello (``communicate()`` would read the pipe itself, past it)."""
    proc = subprocess.Popen(
        ssh_argv(host, options), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=host.env
    )
    try:
        proc.stdin.write(json.dumps(argv, ensure_ascii=True).encode() + b"\n")
        proc.stdin.flush()
        wire.read(proc.stdout)  # kit's hello: what the login shell printed before it, skipped (the rest buffered)
    except (OSError, wire.NoRecord):  # ssh ended, or no kit there: its exit code and its words say why
        pass
    return proc


def run(host: Host, argv: list[str], *, follow: bool = False, write=None) -> int:
    """``kit ARGV`` on the login node, its output here as it comes (to ``write``; default: our standard output,
    escaped for a terminal); its exit code. An SSH failure is one
    :class:`KitError` (exit 1) saying what ssh said and what to do. ``follow`` (``logs -f``): a dropped
    connection is opened again and the command run again, its output going on from the byte it had reached
    (a followed log only grows), for up to :data:`RIDE_THROUGH` seconds."""
    options = connection_options(host)
    shown, deadline = 0, None
    while True:
        proc = start(host, argv, options)
        tail = forward_stderr(proc)
        code = pass_through(proc, skip=shown, write=write)
        shown, said = proc.shown, tail.join()
        if not (follow and code == 255):
            return checked(host, code, said, options)
        deadline = deadline or time.monotonic() + RIDE_THROUGH
        if time.monotonic() > deadline or (host.reuse_only and not master_alive(host, options)):
            return checked(host, code, said, options)
        time.sleep(1)


class _Stderr(threading.Thread):
    """The remote side's stderr to ours (``echo``), line by line; the last lines kept (ssh's own, for
    diagnosis)."""

    def __init__(self, stream, echo: bool = True):
        super().__init__(daemon=True)
        self.stream, self.tail, self.echo = stream, [], echo
        self.shown = Shown(sys.stderr.buffer) if echo else None

    def run(self):
        for raw in iter(self.stream.readline, b""):
            line = raw.decode(errors="replace")
            self.tail.append(line)
            del self.tail[:-20]
            if self.echo and not line.startswith(FOUND):  # remote_command's word to this side (checked)
                self.shown(raw)

    def join(self, timeout: float | None = 5) -> str:
        super().join(timeout)
        return "".join(self.tail)


class Session:
    """One connection running ``kit ARGV`` on the login node for the Python API: JSON lines on its output
    (:meth:`read_json`), bytes to its input (:meth:`send`). A failure — ssh's, or kit's there (its
    ``kit: …`` line) — is a :class:`KitError` here; the input is closed (and kit there ends) on leaving."""

    def __init__(self, host: Host, argv: list[str]):
        self.host, self.argv = host, argv

    def __enter__(self) -> "Session":
        self.options = connection_options(self.host)
        self.proc = start(self.host, self.argv, self.options)
        self.err = _Stderr(self.proc.stderr, echo=False)
        self.err.start()
        return self

    def read_json(self) -> dict:
        try:
            return wire.read(self.proc.stdout)
        except wire.NoRecord as e:
            self.fail(str(e))

    def send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except OSError:
            self.fail()

    def fail(self, reason: str = "no answer"):
        """Always raises: ssh's failure, kit's there (its words), or what was wrong with its answer."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # kit there ends when its input does
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        said = self.err.join()
        checked(self.host, code, said, self.options)  # ssh's own failures, no kit there
        if code == 0 or not said.strip():
            raise KitError(
                f"kit on {self.host.name} gave no answer kit can read: {reason}", field="--host", exit_code=1
            )
        raise failure(self.host, code, said)

    def __exit__(self, *exc) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def forward_stderr(proc, echo: bool = True) -> _Stderr:
    thread = _Stderr(proc.stderr, echo)
    thread.start()
    return thread


def pass_through(proc, skip: int = 0, write=None) -> int:
    """``proc``'s stdout to ``write`` (ours, :class:`Shown`) as it comes, but for its first ``skip`` bytes (an
    earlier connection showed them); ssh's exit code. ``proc.shown``: the bytes shown so far, the skipped ones
    counted."""
    seen, write = 0, write or Shown()
    try:
        while chunk := proc.stdout.read1(65536):  # the buffer start() read the hello through, then the pipe
            new = chunk[max(0, skip - seen) :]
            seen += len(chunk)
            if new:
                write(new)
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        raise
    finally:
        proc.stdin.close()  # the login node's kit ends when its input does
        proc.stdout.close()
    proc.shown = max(seen, skip)
    return code


def riding_through(attempt, note=lambda: None):
    """``attempt()``, made again while it fails for want of a connection (:class:`Unreachable`), for up to
    :data:`RIDE_THROUGH` seconds from the first such failure; ``note()`` told before each new attempt."""
    deadline = None
    while True:
        try:
            return attempt()
        except Unreachable:
            deadline = deadline or time.monotonic() + RIDE_THROUGH
            if time.monotonic() > deadline:
                raise
            note()
        time.sleep(2)
