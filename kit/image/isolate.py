"""How a build step runs code: inside the image's root, isolated by bubblewrap (its own PID, mount, IPC and UTS
namespaces, Docker's default capabilities less MKNOD), its output captured for the step that ran it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kit.errors import KitError
from kit.image import rootpath
from kit.runner import preexec

# Docker's default capabilities for build steps, less MKNOD (a RUN step must not make a
# node for the host's disk): enough for apt, chown and setuid-to-a-user, nothing that mounts,
# loads modules, traces host processes or changes the host's clock or network.
STEP_CAPS = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_RAW",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)


def isolate_argv(root: Path, env: dict[str, str], workdir: str = "/") -> list[str]:
    """bubblewrap's words that run a command inside ``root`` as a build step: its own PID,
    mount, IPC and UTS namespaces (``pivot_root`` into the image: no host path and no host
    process is reachable), a fresh ``/proc``, a minimal ``/dev``, ``/sys`` read-only, a
    private ``/tmp``, the host's network and DNS, only ``env``, Docker's default capabilities
    less MKNOD with no-new-privileges, and killed with kit (``--die-with-parent``)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise KitError(
            "bwrap not found: build steps run in bubblewrap's isolation",
            hint="install bubblewrap (apt-get install -y bubblewrap)",
            exit_code=1,
        )
    argv = [
        bwrap,
        "--bind",
        str(root),
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
    ]
    for cap in STEP_CAPS:
        argv += ["--cap-add", cap]
    if Path("/sys").is_dir():
        argv += ["--ro-bind", "/sys", "/sys"]
    if Path("/etc/resolv.conf").exists():
        # The file must exist in the image to be bound over (an empty one is left, as before).
        rootpath.directory(root, "/etc")
        target = rootpath.inside(root, "/etc/resolv.conf")
        if not target.exists() and not target.is_symlink():
            target.touch()
        if target.is_file() and not target.is_symlink():
            argv += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
    argv.append("--clearenv")
    for k, v in env.items():
        argv += ["--setenv", k, v]
    return [*argv, "--chdir", workdir, "--"]


def run_in_root(root: Path, argv: list[str], env: dict[str, str], label: str) -> subprocess.CompletedProcess:
    """Run ``argv`` inside ``root`` with only ``env``, isolated (:func:`isolate_argv`)."""
    try:
        full = [*isolate_argv(root, env), *argv]
    except KitError as e:
        raise KitError(e.message, field=label, hint=e.hint, exit_code=e.exit_code) from None
    return subprocess.run(
        full,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        preexec_fn=preexec(),
    )
