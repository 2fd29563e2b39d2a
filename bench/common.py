"""What the benches share (run as scripts: `python bench/NAME.py` puts this directory on sys.path)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def wait_for(predicate, timeout: float, poll: float = 0.05):
    """Poll ``predicate`` until it returns something true (returned), or raise after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout} s")


def tiny_rootfs(where: Path) -> Path:
    """A small root filesystem for --quick runs (a few MiB: text, random bytes, links, a deep path)."""
    import os

    root = where / "tiny-rootfs"
    for sub in ("usr/bin", "usr/lib/python3/site-packages/pkg", "etc", "var/empty"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for i in range(64):
        (root / "usr" / "lib" / "python3" / "site-packages" / "pkg" / f"m{i}.py").write_text(f"VALUE = {i}\n" * 200)
        (root / "usr" / "bin" / f"tool{i}").write_bytes(os.urandom(16 * 1024))
    (root / "etc" / "os-release").write_text('ID=tiny\nNAME="tiny bench root"\n')
    (root / "usr" / "bin" / "link").symlink_to("tool0")
    return root


def thread_cpu_seconds(pid: int) -> float:
    """CPU time of the process's live threads, to the nanosecond (/proc/PID/task/*/schedstat);
    exact while no thread exits, unlike /proc's 10 ms ticks (which read 0 for a launcher's ~12 ms).
    0 where the kernel keeps no schedstat or the process is gone."""
    total = 0
    for f in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(f.read_text().split()[0])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def start_exporter(
    port: int, log: Path, gpus: bool = True, args: tuple[str, ...] = ("--interval", "0.5", "--no-node")
) -> subprocess.Popen:
    """The exporter, once it serves GPU series (``gpus``), or any scrape (where no GPU is)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kit.monitor", "--port", str(port), "--bind", "127.0.0.1", *args],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if "DCGM_FI_DEV_GPU_UTIL" in scrape(port) or not gpus or proc.poll() is not None:
                break
        except OSError:
            pass
        time.sleep(0.2)
    return proc


def on_cluster(name: str, kit_home: str | None, nodes: int, measure) -> None:
    """``measure(cluster, tmp)`` on the local cluster up under ``kit_home`` (the suite's), else on a throw-away one
    of ``nodes`` nodes, taken down after; ``tmp`` a directory of the run's own."""
    import sys
    import tempfile

    from kit.cluster import LocalCluster

    with tempfile.TemporaryDirectory() as d:
        if kit_home:
            cluster = LocalCluster(Path(kit_home))
            if not cluster.running():
                sys.exit(f"{name}: no local cluster is running under {kit_home}")
            measure(cluster, Path(d))
            return
        cluster = LocalCluster(Path(d) / "home")
        cluster.up(nodes=nodes, cpus_per_node=2)
        try:
            measure(cluster, Path(d))
        finally:
            cluster.down(force=True)
