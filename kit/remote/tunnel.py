"""`kit --host LOGIN ui`: kit ui runs on the login node, and its port is forwarded here through the SSH master
connection kit already uses (``ssh -O forward``); the address printed here holds the token kit there made."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys

from kit.errors import KitError
from kit.remote.client import _Stderr, start
from kit.remote.ssh import Host, checked, connection_options, failure

ADDRESS = re.compile(rb"http://127\.0\.0\.1:([0-9]{1,5})/\?token=([A-Za-z0-9_-]{16,64})")


def ui(host: Host, argv: list[str]) -> int:
    """Serve kit there's pages here until Ctrl-C (or kit there ends); kit there's exit code. A Ctrl-C at any moment
    (also before the address is printed) ends kit there and the forward: none is left behind, nor this process
    waiting on an ssh that would never end."""
    options = connection_options(host)
    control = [*host.ssh, "-o", "BatchMode=yes", *options]
    proc = start(host, argv, options)
    err = _Stderr(proc.stderr)
    err.start()
    forward: list[str] = []
    try:
        first = proc.stdout.readline(4096).strip()
        found = ADDRESS.fullmatch(first)
        if found is None:
            return _failed(host, proc, err, options)
        local = _free_port()
        forward = _forward(host, control, local, int(found.group(1)))
        print(f"http://127.0.0.1:{local}/?token={found.group(2).decode()}", flush=True)
        print(
            f"kit ui: {host.name}'s jobs, through the SSH connection; open the address above (Ctrl-C stops)",
            file=sys.stderr,
        )
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if forward:
            subprocess.run([*control, "-O", "cancel", *forward, host.name], capture_output=True, env=host.env)
        with contextlib.suppress(OSError):
            proc.stdin.close()  # kit there ends when its input does
        proc.wait()


def _forward(host: Host, control: list[str], here: int, there: int) -> list[str]:
    """Port ``here`` forwarded to kit ui's port ``there`` through the master: the ``-L`` option it took."""
    forward = ["-L", f"127.0.0.1:{here}:127.0.0.1:{there}"]
    made = subprocess.run(
        [*control, "-O", "forward", *forward, host.name], capture_output=True, text=True, env=host.env
    )
    if made.returncode != 0:
        raise KitError(
            f"ssh could not forward a port to kit ui on {host.name}: {made.stderr.strip()[-300:]}",
            field="--host",
            exit_code=1,
            hint="kit forwards through its SSH master connection: check that ControlMaster is not off for this host",
        )
    return forward


def _failed(host: Host, proc, err: _Stderr, options: list[str]) -> int:
    with contextlib.suppress(OSError):
        proc.stdin.close()
    code = proc.wait()
    said = err.join()
    checked(host, code, said, options)
    raise failure(host, code or 1, said or "kit ui there printed no address")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
