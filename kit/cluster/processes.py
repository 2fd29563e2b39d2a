"""Processes of the local cluster: free ports, a pid that is still the program it was,
stopping daemons (TERM, a bounded wait, KILL), and the jobs' processes found in /proc."""

from __future__ import annotations

import os
import signal
import socket
import time


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that bind right now (the kernel picks them)."""
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def alive(pid: int | None, comm: str) -> bool:
    """True if ``pid`` runs and is the program ``comm`` (not a recycled pid)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    state = stat[stat.rindex(")") + 2 :][:1]
    return name == comm and state != "Z"


def stop_pids(pids: dict[int, str], timeout: float = 10.0) -> None:
    """TERM each live pid, wait up to ``timeout`` seconds, then KILL what is left."""
    live = {p: c for p, c in pids.items() if alive(p, c)}
    for pid in live:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while live and time.monotonic() < deadline:
        live = {p: c for p, c in live.items() if alive(p, c)}
        time.sleep(0.05)
    for pid in live:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def comm(pid: int) -> str:
    """The program name of ``pid`` ("" when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return ""
    return stat[stat.index("(") + 1 : stat.rindex(")")]


def describe(pids: dict[int, str]) -> str:
    return ", ".join(f"{comm} (pid {pid})" for pid, comm in sorted(pids.items()))


def job_processes(conf: str) -> list[tuple[int, str, str]]:
    """(pid, comm, job id) of every process of the jobs of the Slurm whose config is ``conf``:
    slurmstepd and the tasks both carry SLURM_CONF in their environment, and every process
    below one of them is theirs too, whatever its environment (a daemon started with
    ``env -i``); the daemons, this process and its ancestors are left out."""
    needle = f"SLURM_CONF={conf}".encode()
    keep = {0}
    pid = os.getpid()
    while pid > 1:
        keep.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in keep:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if needle not in environ or comm in ("slurmd", "slurmctld"):
            continue
        job = next((e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"SLURM_JOB_ID=")), "")
        if job or comm == "slurmstepd":
            found.append((int(entry), comm, job))
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    seen = {pid for pid, _, _ in found}
    queue = [(pid, job) for pid, _, job in found]
    while queue:
        pid, job = queue.pop()
        for child in children.get(pid, []):
            if child in seen or child in keep:
                continue
            seen.add(child)
            try:
                with open(f"/proc/{child}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if comm not in ("slurmd", "slurmctld"):
                found.append((child, comm, job))
                queue.append((child, job))
    return found


def user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def memory_mb() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return max(int(line.split()[1]) // 1024, 1)
    except OSError:
        pass
    return 1024


def daemons_under(roots, programs: tuple[str, ...]) -> dict[int, str]:
    """pid -> program of the live ``programs`` whose command line names a file under one of ``roots`` (the
    cluster's directory, and the one its clients read, where its slurm.conf is)."""
    prefixes = tuple(f"{r}/" for r in roots)
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
            if comm not in programs:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
            if comm == "slurmdbd":  # its command line names nothing: its SLURM_CONF does
                with open(f"/proc/{entry}/environ", "rb") as f:
                    argv += f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(p in a for a in argv for p in prefixes) and alive(int(entry), comm):
            found[int(entry)] = comm
    return found
