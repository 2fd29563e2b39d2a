"""What kit on a login node answers the laptop through ``ssh``: framed records on a channel a login shell shares.

``ssh LOGIN CMD`` runs the user's login shell first, and its dotfiles may print (a banner, a motd, a module
system's notice). kit there starts by saying :func:`hello` — a record — and the laptop skips what came before it
(:func:`read`: at most ``NOISE_LIMIT`` bytes of it, never parsed; through the pipe's buffered reader, which every
later read of the answer goes on from). Every answer is then one record: a line that
starts with ``MARK`` (a byte no shell banner prints, then ``kit``), JSON after it, at most ``RECORD_LIMIT`` bytes
(a hostile login node cannot make the laptop hold a 1 GiB line). Text kit prints for a person goes between
records, as it is; :class:`Records` takes the records out of such a stream.

Before that, what the laptop says: the command's arguments, as the first line of kit's input (``kit remote-args``
reads them, :func:`read_args`), its own version in ``KIT_CLIENT_VERSION`` (:func:`refuse_other_version`: the
two versions are one, or nothing is done). kit there ends when its input does (:func:`watch_input_end`).
"""

from __future__ import annotations

import json
import os
import sys
import threading

from kit.errors import KitError
from kit.version import __version__

MARK = b"\x1ekit "
RECORD_LIMIT = 64 << 20
NOISE_LIMIT = 1 << 20
# The commands that run on the login node (the rest run where kit is called).
COMMANDS = ("launch", "ps", "logs", "cancel", "report", "rerun", "trim", "cluster", "events", "ui")
# kit there's own commands, which only the laptop calls (kit's command line loads them as its others).
SERVER_COMMANDS = {
    name: f"kit.cli.serving:{name.replace('-', '_')}"
    for name in ("remote-launch", "remote-submit", "remote-wait", "remote-call")
}
READS_INPUT = ("remote-launch", "remote-submit")  # kit there reads its input first, then watches it
VERSION_VARIABLE = "KIT_CLIENT_VERSION"
ARGS_COMMAND = "remote-args"  # the login node's kit reads its arguments from its input (read_args)
ARGS_LIMIT = 1 << 24
INSTALL = "pip install kit-slurm"


class NoRecord(Exception):
    """The stream ended, or what came is not a record kit there wrote (its words say which)."""


def record(value: dict) -> bytes:
    """``value`` as one record: the mark, compact JSON (no newline in it), a newline."""
    return MARK + json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


_serving = False


def write(value: dict, stream=None) -> None:
    """One record to ``stream`` (our standard output, after what was printed to it), in one write, flushed."""
    if stream is None:
        sys.stdout.flush()
        stream = sys.stdout.buffer
    stream.write(record(value))
    stream.flush()


def hello() -> None:
    """kit there's first record: what came before it on the channel was the login shell's."""
    global _serving
    _serving = True
    write({"kit": __version__})


def serving() -> bool:
    """This kit answers a laptop through ssh (it said :func:`hello`)."""
    return _serving


def parse(line: bytes) -> dict:
    """The record ``line`` holds (it starts with ``MARK``); :class:`NoRecord` if it is not a whole one."""
    if not line.endswith(b"\n"):
        raise NoRecord(f"a record longer than {RECORD_LIMIT >> 20} MiB, or cut short")
    try:
        value = json.loads(line[len(MARK) :])
    except ValueError:
        raise NoRecord("a record that is not JSON") from None
    if not isinstance(value, dict):
        raise NoRecord("a record that is not an object")
    return value


def read(stream) -> dict:
    """The next record on the binary, buffered ``stream`` (its ``readline`` reads blocks), the noise before it
    skipped: at most ``NOISE_LIMIT`` bytes of it, counted within a line too (a 200 MB line without a newline is
    refused at the limit, not read to its end). A line is a record when it starts with ``MARK``."""
    noise = 0
    while True:
        head = stream.readline(len(MARK))
        if not head:
            raise NoRecord("the answer ended")
        if head == MARK:
            return parse(head + stream.readline(RECORD_LIMIT + 1))
        noise += len(head)
        while not head.endswith(b"\n") and noise <= NOISE_LIMIT:
            head = stream.readline(NOISE_LIMIT + 1 - noise)
            if not head:
                raise NoRecord("the answer ended")
            noise += len(head)
        if noise > NOISE_LIMIT:
            raise NoRecord(
                f"more than {NOISE_LIMIT >> 20 or NOISE_LIMIT} {'MiB' if NOISE_LIMIT >> 20 else 'bytes'} "
                "before kit's answer"
            )


class Records:
    """A stream's bytes, as they come, to ``write`` (a person's terminal), but its records, kept in ``seen``
    (a record split across two chunks is held until its end comes)."""

    def __init__(self, write):
        self.write, self.pending, self.seen = write, b"", []

    def __call__(self, data: bytes) -> None:
        data, self.pending, shown = self.pending + data, b"", []
        while data:
            end = data.find(b"\n") + 1
            line, data = (data[:end], data[end:]) if end else (data, b"")
            if line.startswith(MARK) and end:
                try:
                    self.seen.append(parse(line))
                except NoRecord:
                    pass
            elif not end and (line.startswith(MARK) or MARK.startswith(line)) and len(line) <= RECORD_LIMIT:
                self.pending = line  # perhaps a record: its end is still to come
            else:
                shown.append(line)
        if shown:
            self.write(b"".join(shown))


# What sshd sets for the session it runs kit in: a connection's, not the login node's. A job launched for a client
# inherits this kit's environment; with these in it a job's `bash -c` reads ~/.bashrc (bash's rule for a shell sshd
# runs: a site's banner in the job's log, its conda activation in the job), which a launch from a shell on the login
# node does not.
SESSION_VARIABLES = ("SSH_CLIENT", "SSH_CONNECTION", "SSH2_CLIENT", "SSH_TTY")


def as_the_login_node() -> None:
    """On the login node, serving a client: this kit's environment the login node's, without the SSH session's."""
    for name in SESSION_VARIABLES:
        os.environ.pop(name, None)


def read_args() -> list[str]:
    """On the login node: the arguments the client sent as its input's first line (:func:`kit.remote.client.start`)."""
    try:
        argv = json.loads(sys.stdin.buffer.readline(ARGS_LIMIT))
    except ValueError:
        argv = None
    if not isinstance(argv, list) or not all(isinstance(a, str) and "\x00" not in a for a in argv):
        raise KitError("the client sent no command", field=ARGS_COMMAND, exit_code=2)
    return argv


def refuse_other_version(environ: dict | None = None) -> KitError | None:
    """On the login node: a client of another kit version is refused before anything is done. The words are
    read on the client (the laptop): "here" is theirs."""
    theirs = (os.environ if environ is None else environ).get(VERSION_VARIABLE)
    if theirs is None or theirs == __version__:
        return None
    return KitError(
        f"kit {theirs} here, kit {__version__} on the login node",
        field="--host",
        exit_code=2,
        hint=f"use one version on both: {INSTALL}=={__version__} here, or {INSTALL}=={theirs} on the login node",
    )


def watch_input_end() -> None:
    """On the login node: end this kit when the connection does (its standard input closes), so a
    ``logs -f`` whose client went away does not stay behind."""

    def watch():
        try:
            while os.read(0, 65536):  # the descriptor itself: no buffered reader's lock at exit
                pass
        except OSError:
            pass
        os._exit(130)

    threading.Thread(target=watch, daemon=True).start()
