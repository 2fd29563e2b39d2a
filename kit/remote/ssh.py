"""The OpenSSH transport: a login node as the system's ``ssh`` reaches it, and kit's masters to it.

``kit --host LOGIN CMD …`` (or ``KIT_HOST``) runs ``kit CMD …`` on ``LOGIN`` as ``ssh LOGIN`` reaches it, so the
user's ``~/.ssh/config`` applies as it is: Host aliases, ProxyJump, IdentityFile, the agent, their own ControlMaster.
kit never prompts (``BatchMode=yes``): a password or a second factor is entered once, in a master connection the
user starts (``ssh -fNM LOGIN``), which every call then reuses.

One connection per call, at most. Where the user's configuration has no ControlMaster of its own, kit's calls
share one master per destination (``ControlMaster=auto``, kept ``ControlPersist`` seconds after the last call):
the first call opens it, the next ones open nothing. A destination is the alias with everything ``ssh -G``
resolves for it (:func:`control_path`): two sites reached through different bastions under one internal name,
or one name with another known-hosts file, never share a master (ssh's ``%C`` hashes host, port and user only).
In reuse-only mode (``KIT_SSH_REUSE_ONLY=1``, for sites that cap connections or ask a second factor) a call
without a live master fails naming the command that starts one.

Nothing of the laptop's environment crosses (``ssh -T``, no ``SendEnv`` of kit's own; the user's configuration
may send ``LANG``). ``KIT_SSH``: the ssh command, split as a shell would (default ``ssh``; e.g. ``ssh -F
~/.ssh/cluster``); ``KIT_REMOTE_KIT``: kit on the login node (default ``kit``, found on the login shell's PATH).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pwd
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from kit.errors import KitError
from kit.remote.wire import ARGS_COMMAND, INSTALL, VERSION_VARIABLE
from kit.version import __version__

CONTROL_PREFIX = "~/.ssh/kit-"
PERSIST = "600"
FOUND = "kit-found-at "  # remote_command's word, where kit is not on the login shell's PATH but installed
# Where users install kit on a login node: the README's own ~/kit-venv first.
WHERE_USERS_INSTALL = ("$HOME/kit-venv/bin", "$HOME/venv/bin", "$HOME/.venv/bin", "$HOME/.local/bin")


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
            raise KitError(
                f"not a host: {name!r}",
                field="--host",
                hint="a name ssh knows: a Host alias of ~/.ssh/config, or user@login.example.org",
            )
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
        raise KitError(
            f"ssh cannot read its configuration for {host.name}: {_last_line(proc.stderr)}", field="--host", exit_code=1
        )
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
        raise KitError(
            f"cannot make ~/.ssh for kit's master connection: {e}",
            field="--host",
            exit_code=1,
            hint="set a ControlMaster and ControlPath of your own for this host in ~/.ssh/config",
        ) from None
    return [
        "-o",
        "ControlMaster=auto",
        "-o",
        f"ControlPath={control_path(host, resolved)}",
        "-o",
        f"ControlPersist={PERSIST}",
    ]


def control_path(host: Host, resolved: dict[str, str] | None = None) -> str:
    """The socket of kit's master to ``host``: named by the alias and all ``ssh -G`` resolved for it (the jump,
    the proxy command, the known-hosts files, the key), so a master is reused only where ssh would connect
    the very same way."""
    resolved = config(host) if resolved is None else resolved
    key = json.dumps([host.name, sorted(resolved.items())], ensure_ascii=True).encode()
    return CONTROL_PREFIX + hashlib.sha256(key).hexdigest()[:24]


def _control_path(options: list[str]) -> list[str]:
    """kit's ``-o ControlPath=…`` among ``options`` ([] where the user's configuration names its own)."""
    return [w for o in options if o.startswith("ControlPath=") for w in ("-o", o)][:2]


def master_command(host: Host, options: list[str]) -> str:
    """The command a user runs to start the master kit's calls reuse."""
    return shlex.join([*host.ssh, "-fNM", *_control_path(options), host.name])


def master_alive(host: Host, options: list[str]) -> bool:
    proc = subprocess.run(
        [*host.ssh, *_control_path(options), "-O", "check", host.name], capture_output=True, env=host.env
    )
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
    script = (
        f"{found}; {VERSION_VARIABLE}={shlex.quote(__version__)} exec {shlex.join([*host.remote_kit, ARGS_COMMAND])}"
    )
    if "!" in script or "\n" in script:
        encoded = base64.b64encode(script.encode("utf-8", "surrogateescape")).decode()
        return f"exec sh -c 'eval \"$(printf %s {encoded} | base64 -d)\"'"
    return f"exec sh -c {shlex.quote(script)}"


def ssh_argv(host: Host, options: list[str]) -> list[str]:
    return [*host.ssh, "-T", "-o", "BatchMode=yes", *options, host.name, "--", remote_command(host)]


def connection_options(host: Host) -> list[str]:
    """The ssh options of one call: kit's shared master (or the user's), and in reuse-only mode, never a
    connection of its own (:class:`KitError` naming the command that starts a master when none is up)."""
    options = control_options(host, config(host))
    if host.reuse_only:
        if not master_alive(host, options):
            raise KitError(
                f"no SSH master connection to {host.name} to reuse (KIT_SSH_REUSE_ONLY)",
                field="--host",
                exit_code=1,
                hint=f"start one (it asks for your password or second factor once): {master_command(host, options)}",
            )
        options = [*options, "-o", "ControlMaster=no"]
    return options


def checked(host: Host, code: int, said: str, options: list[str]) -> int:
    """ssh's exit code, or the :class:`KitError` its failure is (ssh's own 255, no kit there)."""
    if code == 255:  # ssh's own failure: nothing ran there
        if "REMOTE HOST IDENTIFICATION HAS CHANGED" in said or "Host key verification failed" in said:
            raise KitError(
                f"ssh refused {host.name}: its host key is not the one known for it",
                field="--host",
                exit_code=1,
                hint="if the login node's key really changed, check its fingerprint with "
                "your site and update ~/.ssh/known_hosts (ssh-keygen -R HOST)",
            )
        raise Unreachable(
            f"ssh could not reach {host.name}: {_last_line(said) or 'exit 255'}",
            field="--host",
            exit_code=1,
            hint=f"check that `{shlex.join([*host.ssh, host.name])}` works without a "
            f"prompt (kit never prompts), or start a master: "
            f"{master_command(host, options)}",
        )
    lines = said.strip().splitlines()
    if code == 127 and all(line.startswith(FOUND) for line in lines):  # remote_command's own "not there"
        if lines:
            path = lines[0][len(FOUND) :]
            raise KitError(
                f"kit is not on the login shell's PATH on {host.name}, but installed at {path}",
                field="--host",
                exit_code=1,
                hint=f"`ssh {host.name} CMD` runs a shell that is not interactive, and ~/.bashrc stops "
                "at its interactive guard (Debian's returns at its top): put "
                f'`export PATH="{os.path.dirname(path)}:$PATH"` above that line, or set '
                f"KIT_REMOTE_KIT={path} here",
            )
        looked = "not found"
        if "/" not in host.remote_kit[0]:  # remote_command looked where users install it too
            looked = "not on the login shell's PATH, nor in " + ", ".join(
                d.replace("$HOME", "~") for d in WHERE_USERS_INSTALL
            )
        raise KitError(
            f"kit is not installed on {host.name} ({shlex.join(host.remote_kit)}: {looked})",
            field="--host",
            exit_code=1,
            hint=f"install it there: {INSTALL}=={__version__} (or set KIT_REMOTE_KIT to its path)",
        )
    return code


class Unreachable(KitError):
    """ssh could not reach the login node (its own failure, exit 255): nothing ran there."""


def failure(host: Host, code: int, said: str) -> KitError:
    """kit there failed (not ssh): its ``kit: …`` line (the rest of what it said as the detail)."""
    theirs = [line[5:].strip() for line in said.splitlines() if line.startswith("kit: ")]
    return KitError(
        theirs[0] if theirs else f"kit on {host.name} ended with exit {code}",
        field="host",
        exit_code=code or 1,
        detail="\n".join(said.splitlines()[1:]) or None,
    )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
