"""kit from a laptop: what a call costs over SSH, side by side with the same call
on the login node itself, in one run.

    python bench/bench_remote.py [--host HOST] [--files 1000] [--mb 100] [--runs 5] [--quick]

Without --host it starts what it needs: a 1-node local cluster under a KIT_HOME of its own and a login sshd
on loopback (tests/sshd.py: key-only, the cluster's environment given to its sessions). With --host (the
suite's run) it uses that host as KIT_SSH and KIT_REMOTE_KIT say, and the local cluster of $KIT_HOME.

For each of `kit launch --dry-run`, a real `kit launch` and `kit ps`, the median wall time (--runs runs,
interleaved) here ("local"), over SSH through kit's master connection ("ssh, master"), and over SSH with
no master (a connection per call: ControlPath=none). Targets: + <= 0.5 s per call with a master, + <= 1.5 s
without. Then a repository of --files files / --mb MB launched (dry run) over SSH a second time, unchanged:
the objects it sends (target 0) and its time (target <= 1 s).
--quick: 100 files / 5 MB, 2 runs (the suite's run: the bench keeps working).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def kit(args: list[str], env: dict, cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "kit", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"kit {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return seconds, proc


def make_repo(root: Path, files: int, megabytes: int) -> None:
    root.mkdir(parents=True)
    size = max(1, megabytes * (1 << 20) // files)
    for i in range(files):
        d = root / f"pkg{i % 20}"
        d.mkdir(exist_ok=True)
        (d / f"mod{i}.py").write_bytes(f"# module {i}\n".encode() + os.urandom(size // 2).hex().encode()[:size])
    (root / "train.py").write_text("print('hello')\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.email=b@x", "-c", "user.name=b", "commit", "-qm", "b"]):
        subprocess.run(["git", *args], cwd=root, check=True)


def measure(host: str, here: dict, env: dict, small: Path, out: Path, runs: int) -> list[str]:
    """``here``: the login node's own environment (its KIT_HOME, its cluster); ``env``: the laptop's."""
    no_master = {**env, "KIT_SSH": env["KIT_SSH"] + " -o ControlPath=none"}
    launch = [
        "launch",
        "--local",
        "--nodes",
        "1",
        "--output-dir",
        str(out),
        "--no-exporter",
        "--",
        sys.executable,
        "train.py",
    ]
    calls = {
        "launch --dry-run": [*launch[:1], "--dry-run", *launch[1:]],
        "launch": launch,
        "ps": ["ps", "--output-dir", str(out)],
    }
    ways = {
        "local": ([], here),
        "ssh, master": (["--host", host], env),
        "ssh, no master": (["--host", host], no_master),
    }
    kit(["--host", host, "cluster", "status"], env, small)  # the master, up before the first timing
    times: dict = {(c, w): [] for c in calls for w in ways}
    for _ in range(runs):
        for call, args in calls.items():
            for way, (prefix, e) in ways.items():
                times[call, way].append(kit([*prefix, *args], e, small)[0])
    lines = [f"{'call':<18} {'local':>8} {'ssh, master':>12} {'ssh, no master':>15}   added (master / none)"]
    for call in calls:
        med = {w: statistics.median(times[call, w]) for w in ways}
        lines.append(
            f"{call:<18} {med['local']:>7.2f}s {med['ssh, master']:>11.2f}s {med['ssh, no master']:>14.2f}s"
            f"   +{med['ssh, master'] - med['local']:.2f} s (target 0.5) / "
            f"+{med['ssh, no master'] - med['local']:.2f} s (target 1.5)"
        )
    settle(here, out)
    return lines


ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED", "RESIZING"}


def settle(here: dict, out: Path, timeout: float = 180) -> None:
    """Wait until the bench's jobs (each prints a line) have ended: none writes into its directory after."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = json.loads(kit(["ps", "--json", "--all", "--output-dir", str(out)], here, out.parent)[1].stdout)
        if not [r for r in rows if str(r.get("state", "")).rstrip("*").split(" ")[0] in ACTIVE]:
            return
        time.sleep(1)
    raise SystemExit(f"the bench's jobs in {out} did not end in {timeout:.0f} s")


def unchanged_tree(host: str, here: dict, env: dict, big: Path, out: Path) -> list[str]:
    """The repository launched (dry run: the job directory and its view are written, nothing submitted) over
    SSH twice, and on the login node itself twice, side by side: what SSH adds to an unchanged relaunch."""
    args = ["launch", "--local", "--dry-run", "--output-dir", str(out), "--", sys.executable, "train.py"]
    first, proc1 = kit(["--host", host, *args], env, big)
    again, proc2 = kit(["--host", host, *args], env, big)
    kit(args, here, big)
    local = kit(args, here, big)[0]
    sent = [re.search(r"sent (\d+) object\(s\), ([^,]+),", p.stderr).groups() for p in (proc1, proc2)]
    return [
        f"repository relaunched over ssh: first {first:.2f} s ({sent[0][0]} objects, {sent[0][1]}); "
        f"unchanged {again:.2f} s ({sent[1][0]} objects, {sent[1][1]}) (target <= 1 s, 0 objects); "
        f"the same unchanged relaunch on the login node {local:.2f} s (ssh adds {again - local:+.2f} s)"
    ]


def own_setup(tmp: Path):
    """A 1-node local cluster and a login sshd of the bench's own; (host, env, stop)."""
    sys.path[:0] = [str(REPO), str(REPO / "tests")]
    from sshd import Servers

    from kit.cluster import LocalCluster

    home = tmp / "kit-home"
    os.environ["KIT_HOME"] = str(home)
    cluster = LocalCluster(home)
    cluster.up(nodes=1, cpus_per_node=2)
    (tmp / "ssh").mkdir(mode=0o700)
    servers = Servers(tmp / "ssh", {**cluster.target.env, "KIT_HOME": str(home), "PATH": os.environ["PATH"]}).start()
    env = {**os.environ, "KIT_SSH": " ".join(servers.ssh()), "KIT_REMOTE_KIT": f"{sys.executable} -m kit"}

    def stop():
        servers.stop()
        cluster.down(force=True)

    return "kit-direct", env, stop


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", help="a login host kit reaches as KIT_SSH says (default: start one here)")
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.files, args.mb, args.runs = 100, 5, 2
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # `timeout`: its cluster stopped too
    with tempfile.TemporaryDirectory(prefix="kit-bench-remote-") as tmp:
        tmp = Path(tmp)
        host, env, stop = (args.host, dict(os.environ), lambda: None) if args.host else own_setup(tmp)
        try:
            small, big = tmp / "small", tmp / "big"
            make_repo(small, 5, 1)
            make_repo(big, args.files, args.mb)
            env = {**env, "KIT_HOME": os.environ["KIT_HOME"]}
            laptop = {**env, "KIT_HOME": str(tmp / "laptop-home")}  # the laptop's store is its own
            print(f"kit over SSH to {host}, {args.runs} run(s) each, median wall time:")
            print("\n".join(measure(host, env, laptop, small, tmp / "jobs", args.runs)))
            print("\n".join(unchanged_tree(host, env, laptop, big, tmp / "jobs")))
        finally:
            stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
