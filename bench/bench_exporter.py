"""Exporter benchmark: prints, in one run, side by side on this machine:

1. scrape latency p50/p99 and CPU time per scrape of `kit exporter` with 8 test GPUs
   (tests/libnvml, behind the real nvidia-ml-py binding), next to Debian's prometheus-node-exporter scraped
   the same way;
2. the exporter's RSS and its CPU share at a 1 s scrape interval (polling included);
3. the job collector's cost per poll with 100, 1,000 and 5,000 other processes on the
   node, reading every environment (as before) against following the job's trees;
4. a 2-node local job's training throughput with its exporters scraped every
   second by a real Prometheus, against the same job with them stopped.

    python bench/bench_exporter.py [--scrapes 300] [--windows 48] [--seconds 4] [--quick]

--quick: 20 scrapes, one ABBA block of 1 s windows on the GPU-shaped job only (the test
suite's run: the bench keeps working; its numbers mean nothing).

How 4 is measured: separate jobs on this 2-core VM differ by 10-20 % run to run,
far more than the 1 % to be shown. So one long job runs, and its exporters are
alternately running and stopped (SIGSTOP: no CPU at all) in windows ordered
A B B A; each block of four gives a ratio in which a drift of the machine
cancels, and the blocks give a 95 % confidence interval. The same comparison
between windows in the same state shows the noise floor. The exporters' and
Prometheus's CPU time, read from /proc, gives a bound that needs no statistics:
the job cannot lose more wall time than they ran.

Targets: p99 < 10 ms, RSS < 40 MB, < 1 % of one core at 1 s, throughput ratio >= 0.99
(on the GPU-shaped job: the CPU-time bound, with the measured ratio's confidence
interval reaching it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import thread_cpu_seconds

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")

FAKE_EXPORTER = """
import os, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from fake_gpus import FakeGpus, preload
preload()
os.environ.update(FakeGpus(Path(tempfile.mkdtemp(prefix="kit-bench-nvml-")) / "state").env())
from kit.monitor.exporter import Exporter
from kit.monitor.gpu import GpuSource
from kit.monitor.node import NodeSource
from kit.monitor.training import TrainingSource
e = Exporter([GpuSource(hostname="bench"), NodeSource(), TrainingSource(None)],
             interval=1.0, bind="127.0.0.1", port={port}, env={{"SLURM_JOB_ID": "1"}})
done = Exporter.catch_signals()
e.start()
print("ready", flush=True)
try:
    e.serve_until(done)
finally:
    e.stop()
"""


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_ready(port: int) -> None:
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing answers on port {port}")


WARM_UP = 10.0  # seconds between the job's start and the first window
QUIET = 5.0  # seconds of no scrape in which the exporter's polling cost is measured


def measure(pid: int, port: int, scrapes: int) -> dict:
    url = f"http://127.0.0.1:{port}/metrics"
    urllib.request.urlopen(url).read()
    # Background cost (polling), measured over a quiet while (no scrape, so no thread comes or goes).
    c0 = thread_cpu_seconds(pid)
    time.sleep(QUIET)
    idle_per_s = (thread_cpu_seconds(pid) - c0) / QUIET
    lat = []
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    for _ in range(scrapes):
        s = time.perf_counter()
        body = urllib.request.urlopen(url).read()
        lat.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(pid) - c0 - idle_per_s * wall
    lat.sort()
    return {
        "p50": lat[len(lat) // 2],
        "p99": lat[int(len(lat) * 0.99) - 1],
        "cpu_per_scrape": max(cpu, 0) / scrapes,
        "idle_cpu_per_s": idle_per_s,
        "rss": rss_mb(pid),
        "series": body.count(b"\n") - body.count(b"\n#"),
    }


def scrape_bench(scrapes: int) -> tuple[dict, dict | None]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", FAKE_EXPORTER.format(tests=str(REPO / "tests"), port=port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        proc.stdout.readline()
        wait_ready(port)
        kit = measure(proc.pid, port, scrapes)
    finally:
        proc.terminate()
        proc.wait(10)
    node = None
    binary = shutil.which("prometheus-node-exporter")
    if binary:
        port = free_port()
        ne = subprocess.Popen(
            [binary, f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_ready(port)
            node = measure(ne.pid, port, scrapes)
        finally:
            ne.terminate()
            ne.wait(10)
    return kit, node


def collector_bench(counts: list[int], polls: int) -> list[tuple[int, float, float]]:
    """The job collector's CPU time per poll with N other processes on the node: reading
    every process's environment at each poll (before: rescan=0) against walking down the
    job's own process trees between full scans (now). The job: 3 processes."""
    from kit.monitor.job import JobSource

    tag = {**os.environ, "SLURM_JOB_ID": "bench-job", "SLURMD_NODENAME": "bench"}
    job = [subprocess.Popen(["sleep", "600"], env=tag) for _ in range(3)]
    others: list[subprocess.Popen] = []
    rows = []
    try:
        for n in counts:
            while len(others) < n:
                others.append(subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, start_new_session=True))
            cost = {}
            for label, rescan in (("before", 0.0), ("now", 3600.0)):
                source = JobSource("bench-job", "bench", env={}, rescan=rescan)
                source.poll()  # the first poll scans in both
                c0 = time.process_time()
                for _ in range(polls):
                    result = source.poll()
                cost[label] = (time.process_time() - c0) / polls
                found = next(x.value for x in result.samples if x.spec.name == "kit_job_processes")
                if found != 3:
                    raise SystemExit(f"the job collector found {found} of the job's 3 processes ({label})")
            rows.append((n, cost["before"], cost["now"]))
    finally:
        for p in job + others:
            p.kill()
        for p in job + others:
            p.wait()
    return rows


def exporter_pids(job_dir: str) -> list[int]:
    """The job's exporter processes (the launcher's sidecar on each node)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kit.monitor" in cmdline and f"KIT_JOB_DIR={job_dir}".encode() in environ:
            found.append(int(entry))
    return found


def progress(job_dir: str, after: float = 0.0, timeout: float = 10.0) -> tuple[int, float]:
    """Rank 0's samples so far and the wall time of the step that reached them,
    from the file kit's Lightning callback rewrites every second; waits for a
    step taken after ``after``."""
    deadline = time.monotonic() + timeout
    while True:
        for f in Path(job_dir, "metrics").glob("*/rank-0.json"):
            try:
                values = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if values["last_step_timestamp_seconds"] > after:
                return values["samples_total"], values["last_step_timestamp_seconds"]
        if time.monotonic() > deadline:
            raise TimeoutError(f"no training progress in {job_dir} after {after}")
        time.sleep(0.05)


def throughput_bench(windows: int, seconds: float, train_args: list[str]) -> dict:
    """One long 2-node job whose exporters are alternately running (scraped every
    second by Prometheus) and stopped (SIGSTOP: no CPU at all), in windows ordered
    A B B A so that a drift of the machine cancels within each block of four."""
    from kit.cluster import LocalCluster

    home = Path(tempfile.mkdtemp(prefix="kit-bench-"))
    env = {**os.environ, "KIT_HOME": str(home)}
    cluster = LocalCluster(home)
    os.environ["KIT_HOME"] = str(home)
    cluster.up(nodes=2, cpus_per_node=2, prometheus=True)
    rates: list[tuple[bool, float]] = []
    cpu = {True: [0.0, 0.0, 0.0], False: [0.0, 0.0, 0.0]}  # state -> [exporters, prometheus, wall]
    pids: list[int] = []
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "kit",
                "launch",
                "--local",
                "--nodes",
                "2",
                "--json",
                "--output-dir",
                str(home / "jobs"),
                "--",
                sys.executable,
                "-m",
                "kit.train",
                "--max-steps",
                "100000000",
                "--checkpoint-every",
                "0",
                *train_args,
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        job = json.loads(out.stdout)
        job_dir = job["job_dir"]
        progress(job_dir, timeout=120)
        pids = exporter_pids(job_dir)
        if len(pids) != 2:
            raise SystemExit(f"expected 2 exporters, found {len(pids)}")
        prometheus = cluster.state().pids["prometheus"]
        time.sleep(WARM_UP)  # Prometheus has found both targets
        for i in range(windows):
            running = i % 4 in (0, 3)
            for pid in pids:
                os.kill(pid, signal.SIGCONT if running else signal.SIGSTOP)
            switched = time.time()
            exp0, prom0 = sum(cpu_seconds(p) for p in pids), cpu_seconds(prometheus)
            s0, t0 = progress(job_dir, after=switched + 0.1)  # a step taken in this state
            time.sleep(max(0.0, switched + seconds - time.time()))
            s1, t1 = progress(job_dir, after=t0)  # a later write than the window's first (1 s apart at most)
            acc = cpu[running]
            acc[0] += sum(cpu_seconds(p) for p in pids) - exp0
            acc[1] += cpu_seconds(prometheus) - prom0
            acc[2] += time.time() - switched
            rates.append((running, (s1 - s0) / (t1 - t0)))
            print(
                f"  window {i + 1:>3}/{windows}  exporter {'running' if running else 'stopped'}  "
                f"{rates[-1][1]:9.1f} samples/s",
                flush=True,
            )
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        cluster.down(force=True)  # cancels the job and waits for it
        shutil.rmtree(home, ignore_errors=True)
    # Per block of four (A B B A): (A + A) / (B + B).
    blocks = [rates[i : i + 4] for i in range(0, len(rates) - 3, 4)]
    ratios = [(b[0][1] + b[3][1]) / (b[1][1] + b[2][1]) for b in blocks]
    # The same comparison between windows in the same state (B B, and A A across blocks): the noise floor.
    same = [b[2][1] / b[1][1] for b in blocks] + [blocks[k + 1][0][1] / blocks[k][3][1] for k in range(len(blocks) - 1)]
    return {
        "ratios": ratios,
        "same": same,
        "with": [r for on, r in rates if on],
        "without": [r for on, r in rates if not on],
        "exporter_cpu_per_s": cpu[True][0] / cpu[True][2],
        # What scraping them costs Prometheus (here on the job's cores; on a site, on its own machine).
        "prometheus_cpu_per_s": cpu[True][1] / cpu[True][2] - cpu[False][1] / cpu[False][2],
    }


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % confidence interval."""
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, float("inf")
    return m, 1.96 * statistics.stdev(values) / len(values) ** 0.5


# Job shapes: (title, trainer arguments, whether the throughput target is judged on it).
SHAPES = (
    # A GPU job's ranks mostly wait for the device: the reference model's CPU step (~5 ms here)
    # followed by 10 ms of waiting, as for kernels, leaves the node's cores partly idle.
    ("GPU-shaped: each step waits 10 ms, as for its kernels", ["--step-delay", "0.01"], True),
    # The worst case, for information: two ranks keep both cores of this machine busy, so every
    # ms the exporter runs is taken from them (this VM's window-to-window noise is ~20 % here).
    ("CPU-bound: the ranks keep every core busy (worst case, not a target)", [], False),
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=300)
    ap.add_argument("--windows", type=int, default=48, help="Windows (a multiple of 4: A B B A blocks).")
    ap.add_argument("--seconds", type=float, default=4.0, help="Length of one window.")
    ap.add_argument("--train-args", default="", help="More arguments for python -m kit.train, in both shapes.")
    ap.add_argument("--quick", action="store_true", help="tiny counts, one shape (the test suite's run)")
    args = ap.parse_args()
    shapes = SHAPES
    if args.quick:
        global WARM_UP, QUIET
        args.scrapes, args.windows, args.seconds, WARM_UP, QUIET, shapes = 20, 4, 1.0, 2.0, 1.0, SHAPES[:1]
    kit, node = scrape_bench(args.scrapes)
    ms = 1000
    print(f"{'scrapes':<46}{args.scrapes}")
    print(f"{'':<46}{'kit exporter (8 fake GPUs)':>28}{'prometheus-node-exporter':>28}")

    def row(label, key, scale, fmt):
        other = fmt.format(node[key] * scale) if node else "-"
        print(f"{label:<46}{fmt.format(kit[key] * scale):>28}{other:>28}")

    row("series per scrape", "series", 1, "{:.0f}")
    row("scrape latency p50 (ms)", "p50", ms, "{:.2f}")
    row("scrape latency p99 (ms)        target < 10", "p99", ms, "{:.2f}")
    row("CPU per scrape (ms)", "cpu_per_scrape", ms, "{:.2f}")
    row("CPU while idle, polling (ms/s)", "idle_cpu_per_s", ms, "{:.2f}")
    row("RSS (MB)                       target < 40", "rss", 1, "{:.1f}")
    share = (kit["idle_cpu_per_s"] + kit["cpu_per_scrape"]) * 100
    print(f"{'kit exporter at a 1 s scrape interval':<46}{share:>27.2f}%  of one core (target < 1 %)")
    ok = kit["p99"] < 0.010 and kit["rss"] < 40 and share < 1.0
    counts = [100] if args.quick else [100, 1000, 5000]
    print(
        f"\njob collector (kit_job_*), CPU per poll, the job's 3 processes among N others "
        f"({3 if args.quick else 20} polls each)"
    )
    print(f"{'other processes':<20}{'before: every environment':>28}{'now: the job trees':>22}{'ratio':>8}")
    for n, before, now in collector_bench(counts, 3 if args.quick else 20):
        print(f"{n:<20}{before * 1000:>25.2f} ms{now * 1000:>19.3f} ms{now / before if before else 0:>8.3f}")
    for title, train_args, judged in shapes:
        print(f"\n2-node job, {title}")
        job = throughput_bench(args.windows, args.seconds, train_args + args.train_args.split())
        ratio, ci = mean_ci(job["ratios"])
        same, same_ci = mean_ci(job["same"])
        noise = statistics.pstdev([x - 1 for x in job["same"]]) if len(job["same"]) > 1 else float("nan")
        print(
            f"{'  samples/s per rank, exporter running':<50}{statistics.median(job['with']):>12.1f}"
            f"  (median of {len(job['with'])} windows of {args.seconds:g} s)"
        )
        print(
            f"{'  samples/s per rank, exporter stopped':<50}{statistics.median(job['without']):>12.1f}"
            f"  (median of {len(job['without'])} windows)"
        )
        target = "  (target >= 0.99)" if judged else ""
        print(
            f"{'  throughput ratio running/stopped':<50}{ratio:>12.4f}  +- {ci:.4f} (95 %, "
            f"{len(job['ratios'])} ABBA blocks){target}"
        )
        print(
            f"{'  same-state windows compared the same way':<50}{same:>12.4f}  +- {same_ci:.4f} "
            f"(window-to-window noise {noise * 100:.1f} %)"
        )
        # Every ms an exporter runs on the job's cores can stall a rank, and so the whole job, by at
        # most that ms: a bound on the loss that needs no statistics (their CPU time, from /proc).
        bound = 1 - job["exporter_cpu_per_s"]
        print(
            f"{'  CPU of both exporters while running (ms/s)':<50}{job['exporter_cpu_per_s'] * 1000:>12.2f}"
            f"  -> throughput ratio >= {bound:.4f}{target}"
        )
        # Prometheus shares these cores only on this one-machine cluster; on a site it has its own.
        print(
            f"{'  Prometheus scraping them, same cores (ms/s)':<50}{job['prometheus_cpu_per_s'] * 1000:>12.2f}"
            f"  (here only; counted in the measured ratio)"
        )
        if judged:
            # The bound must clear the target and the measurement must not contradict it.
            ok = ok and bound >= 0.99 and ratio + ci >= 0.99
    print("\ntargets met" if ok else "\nTARGETS MISSED")


if __name__ == "__main__":
    main()
