"""kit from a laptop: a kit command run on the login node through the system's OpenSSH client.

``kit --host LOGIN CMD …`` (or ``KIT_HOST``) runs ``kit CMD …`` on ``LOGIN`` as ``ssh LOGIN`` reaches it, so the
user's ``~/.ssh/config`` applies as it is: Host aliases, ProxyJump, IdentityFile, the agent, their own ControlMaster.
kit never prompts (``BatchMode=yes``): a password or a second factor is entered once, in a master connection the
user starts (``ssh -fNM LOGIN``), which every call then reuses.

One connection per call, at most. Where the user's configuration has no ControlMaster of its own, kit's calls
share one master (``ControlMaster=auto``, ``ControlPath=~/.ssh/kit-%C``, kept ``ControlPersist`` seconds after
the last call): the first call opens it, the next ones open nothing. In reuse-only mode (``KIT_SSH_REUSE_ONLY=1``,
for sites that cap connections or ask a second factor) a call without a live master fails naming the command
that starts one.

What crosses: the command's arguments, and nothing of the laptop's environment (``ssh -T``, no ``SendEnv`` of
kit's own; the user's configuration may send ``LANG``). The arguments travel as the first line of the channel's
data (``kit remote-args`` reads them), never on the login node's command line, where every user's ``ps`` would
show a ``--env`` secret. kit on the login node is ``KIT_REMOTE_KIT`` (default ``kit``, found on the login shell's
PATH); it refuses a client of another version before it does anything (``KIT_CLIENT_VERSION``), answers in
records (:mod:`kit.wire`: a login shell's banner is skipped), and ends when the connection does (its input closes).
``KIT_SSH``: the ssh command, split as a shell would (default ``ssh``; e.g. ``ssh -F ~/.ssh/cluster``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pwd
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kit import wire
from kit.core.text import Shown
from kit.errors import KitError
from kit.version import __version__

# The commands that run on the login node (the rest run where kit is called).
COMMANDS = ("launch", "ps", "logs", "cancel", "report", "rerun", "trim", "cluster")
CONTROL_PATH = "~/.ssh/kit-%C"
PERSIST = "600"
RIDE_THROUGH = 600  # seconds a followed log waits for its connection to come back
READS_INPUT = ("remote-launch", "remote-submit")  # kit there reads its input first, then watches it
INSTALL = "pip install kit-slurm"
VERSION_VARIABLE = "KIT_CLIENT_VERSION"
ARGS_COMMAND = "remote-args"  # the login node's kit reads its arguments from its input (read_args)
ARGS_LIMIT = 1 << 24
FOUND = "kit-found-at "  # remote_command's word, where kit is not on the login shell's PATH but installed
WHERE_USERS_INSTALL = ("$HOME/venv/bin", "$HOME/.venv/bin", "$HOME/.local/bin")


@dataclass(frozen=True)
class Host:
    """A login node as ``ssh`` reaches it, and how kit talks to it."""

    name: str
    ssh: tuple[str, ...] = ("ssh",)
    remote_kit: tuple[str, ...] = ("kit",)
    reuse_only: bool = False
    env: dict = field(default_factory=dict, compare=False)  # the process environment ssh runs in

    @classmethod
    def of(cls, name: str, environ: dict | None = None) -> "Host":
        """``name`` with kit's ``KIT_SSH``, ``KIT_REMOTE_KIT`` and ``KIT_SSH_REUSE_ONLY`` from ``environ``."""
        env = dict(os.environ if environ is None else environ)
        name = name.strip()
        if not name or name.startswith("-") or any(c.isspace() for c in name):
            raise KitError(f"not a host: {name!r}", field="--host",
                           hint="a name ssh knows: a Host alias of ~/.ssh/config, or user@login.example.org")
        try:
            ssh = tuple(shlex.split(env.get("KIT_SSH") or "ssh"))
            remote = tuple(shlex.split(env.get("KIT_REMOTE_KIT") or "kit"))
        except ValueError as e:
            raise KitError(f"KIT_SSH or KIT_REMOTE_KIT: {e}", field="--host") from None
        reuse = env.get("KIT_SSH_REUSE_ONLY", "").lower() in ("1", "yes", "true")
        return cls(name, ssh or ("ssh",), remote or ("kit",), reuse, env)


def config(host: Host) -> dict[str, str]:
    """What ssh will use for ``host`` (``ssh -G``): the user's configuration, resolved."""
    proc = subprocess.run([*host.ssh, "-G", host.name], capture_output=True, text=True, env=host.env)
    if proc.returncode != 0:
        raise KitError(f"ssh cannot read its configuration for {host.name}: {_last_line(proc.stderr)}",
                       field="--host", exit_code=1)
    out = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        out.setdefault(key.lower(), value)
    return out


def control_options(host: Host, resolved: dict[str, str]) -> list[str]:
    """kit's shared master, unless the user's configuration has a ControlMaster of its own."""
    if resolved.get("controlpath", "none") != "none" and resolved.get("controlmaster", "false") != "false":
        return []
    try:  # where ssh puts kit's master socket (ssh's ~ is the account's home, not $HOME)
        (Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh").mkdir(mode=0o700, exist_ok=True)
    except (KeyError, OSError) as e:
        raise KitError(f"cannot make ~/.ssh for kit's master connection: {e}", field="--host", exit_code=1,
                       hint="set a ControlMaster and ControlPath of your own for this host in ~/.ssh/config") from None
    return ["-o", "ControlMaster=auto", "-o", f"ControlPath={CONTROL_PATH}", "-o", f"ControlPersist={PERSIST}"]


def _control_path(options: list[str]) -> list[str]:
    """kit's ``-o ControlPath=…`` among ``options`` ([] where the user's configuration names its own)."""
    return [w for o in options if o.startswith("ControlPath=") for w in ("-o", o)][:2]


def master_command(host: Host, options: list[str]) -> str:
    """The command a user runs to start the master kit's calls reuse."""
    return shlex.join([*host.ssh, "-fNM", *_control_path(options), host.name])


def master_alive(host: Host, options: list[str]) -> bool:
    proc = subprocess.run([*host.ssh, *_control_path(options), "-O", "check", host.name],
                          capture_output=True, env=host.env)
    return proc.returncode == 0


def remote_command(host: Host) -> str:
    """The command line the login node's shell runs: kit, told the client's version, reading its arguments
    from its input (:func:`start`, :func:`read_args`); exit 127 and nothing said when there is no such kit
    there (the client says it, once). The login shell may be csh: it is only asked to run ``sh -c`` with one
    single-quoted word, which the sh, bash, dash and csh families read the same; a script with what csh would
    not pass on in it (``!``, a newline: ``KIT_REMOTE_KIT`` may hold them) travels as base64."""
    name = host.remote_kit[0]
    probe = ""
    if "/" not in name and shlex.quote(name) == name:  # where users install it: said, so that the client tells
        # why the shell did not find it
        probe = "".join(f'[ -x "{d}/{name}" ] && echo "{FOUND}{d}/{name}" >&2; ' for d in WHERE_USERS_INSTALL)
    found = f"command -v {shlex.quote(name)} >/dev/null 2>&1 || {{ {probe}exit 127; }}"
    script = f"{found}; {VERSION_VARIABLE}={shlex.quote(__version__)} exec {shlex.join([*host.remote_kit, ARGS_COMMAND])}"
    if "!" in script or "\n" in script:
        encoded = base64.b64encode(script.encode("utf-8", "surrogateescape")).decode()
        return f"exec sh -c 'eval \"$(printf %s {encoded} | base64 -d)\"'"
    return f"exec sh -c {shlex.quote(script)}"


def ssh_argv(host: Host, options: list[str]) -> list[str]:
    return [*host.ssh, "-T", "-o", "BatchMode=yes", *options, host.name, "--", remote_command(host)]


def start(host: Host, argv: list[str], options: list[str]) -> subprocess.Popen:
    """``kit ARGV`` on the login node: ssh started, ``argv`` its input's first line (JSON); its input, output
    and stderr pipes, for the caller to go on with."""
    proc = subprocess.Popen(ssh_argv(host, options), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=host.env)
    try:
        proc.stdin.write(json.dumps(argv, ensure_ascii=True).encode() + b"\n")
        proc.stdin.flush()
        wire.read_from(proc.stdout.fileno())  # kit's hello: what the login shell printed before it, skipped
    except (OSError, wire.NoRecord):  # ssh ended, or no kit there: its exit code and its words say why
        pass
    return proc


def read_args() -> list[str]:
    """On the login node: the arguments the client sent as its input's first line (:func:`start`)."""
    try:
        argv = json.loads(sys.stdin.buffer.readline(ARGS_LIMIT))
    except ValueError:
        argv = None
    if not isinstance(argv, list) or not all(isinstance(a, str) and "\x00" not in a for a in argv):
        raise KitError("the client sent no command", field=ARGS_COMMAND, exit_code=2)
    return argv


def connection_options(host: Host) -> list[str]:
    """The ssh options of one call: kit's shared master (or the user's), and in reuse-only mode, never a
    connection of its own (:class:`KitError` naming the command that starts a master when none is up)."""
    options = control_options(host, config(host))
    if host.reuse_only:
        if not master_alive(host, options):
            raise KitError(f"no SSH master connection to {host.name} to reuse (KIT_SSH_REUSE_ONLY)",
                           field="--host", exit_code=1,
                           hint=f"start one (it asks for your password or second factor once): "
                                f"{master_command(host, options)}")
        options = [*options, "-o", "ControlMaster=no"]
    return options


def run(host: Host, argv: list[str], *, follow: bool = False) -> int:
    """``kit ARGV`` on the login node, its output here as it comes; its exit code. An SSH failure is one
    :class:`KitError` (exit 1) saying what ssh said and what to do. ``follow`` (``logs -f``): a dropped
    connection is opened again and the command run again, its output going on from the byte it had reached
    (a followed log only grows), for up to :data:`RIDE_THROUGH` seconds."""
    options = connection_options(host)
    shown, deadline = 0, None
    while True:
        proc = start(host, argv, options)
        tail = forward_stderr(proc)
        code = pass_through(proc, skip=shown)
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
            raise KitError(f"kit on {self.host.name} gave no answer kit can read: {reason}", field="--host",
                           exit_code=1)
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
            new = chunk[max(0, skip - seen):]
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


def checked(host: Host, code: int, said: str, options: list[str]) -> int:
    """ssh's exit code, or the :class:`KitError` its failure is (ssh's own 255, no kit there)."""
    if code == 255:  # ssh's own failure: nothing ran there
        if "REMOTE HOST IDENTIFICATION HAS CHANGED" in said or "Host key verification failed" in said:
            raise KitError(f"ssh refused {host.name}: its host key is not the one known for it", field="--host",
                           exit_code=1, hint="if the login node's key really changed, check its fingerprint with "
                                             "your site and update ~/.ssh/known_hosts (ssh-keygen -R HOST)")
        raise Unreachable(f"ssh could not reach {host.name}: {_last_line(said) or 'exit 255'}", field="--host",
                          exit_code=1, hint=f"check that `{shlex.join([*host.ssh, host.name])}` works without a "
                                            f"prompt (kit never prompts), or start a master: "
                                            f"{master_command(host, options)}")
    lines = said.strip().splitlines()
    if code == 127 and all(line.startswith(FOUND) for line in lines):  # remote_command's own "not there"
        if lines:
            path = lines[0][len(FOUND):]
            raise KitError(f"kit is not on the login shell's PATH on {host.name}, but installed at {path}",
                           field="--host", exit_code=1,
                           hint=f"`ssh {host.name} CMD` runs a shell that is not interactive, and ~/.bashrc stops "
                                "at its interactive guard (Debian's returns at its top): put "
                                f"`export PATH=\"{os.path.dirname(path)}:$PATH\"` above that line, or set "
                                f"KIT_REMOTE_KIT={path} here")
        raise KitError(f"kit is not installed on {host.name} ({shlex.join(host.remote_kit)}: not found)",
                       field="--host", exit_code=1,
                       hint=f"install it there: {INSTALL}=={__version__} (or set KIT_REMOTE_KIT to its path)")
    return code


class Unreachable(KitError):
    """ssh could not reach the login node (its own failure, exit 255): nothing ran there."""


def failure(host: Host, code: int, said: str) -> KitError:
    """kit there failed (not ssh): its ``kit: …`` line (the rest of what it said as the detail)."""
    theirs = [line[5:].strip() for line in said.splitlines() if line.startswith("kit: ")]
    return KitError(theirs[0] if theirs else f"kit on {host.name} ended with exit {code}", field="host",
                    exit_code=code or 1, detail="\n".join(said.splitlines()[1:]) or None)


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


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def refuse_other_version(environ: dict | None = None) -> KitError | None:
    """On the login node: a client of another kit version is refused before anything is done. The words are
    read on the client (the laptop): "here" is theirs."""
    theirs = (os.environ if environ is None else environ).get(VERSION_VARIABLE)
    if theirs is None or theirs == __version__:
        return None
    return KitError(f"kit {theirs} here, kit {__version__} on the login node", field="--host", exit_code=2,
                    hint=f"use one version on both: {INSTALL}=={__version__} here, or {INSTALL}=={theirs} on the "
                         "login node")


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
