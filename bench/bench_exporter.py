"""Exporter benchmark: prints, in one run, side by side on this machine:

1. scrape latency p50/p99 and CPU time per scrape of `kit exporter` with 8 fake
   GPUs (tests/fake_nvml.py), next to Debian's prometheus-node-exporter scraped
   the same way;
2. the exporter's RSS and its CPU share at a 1 s scrape interval (polling included);
3. a 2-node local job's training throughput with the exporter scraped every
   second by a real Prometheus, against the same job without the exporter.

    python bench/bench_exporter.py [--scrapes 300] [--jobs 2]

Targets: p99 < 10 ms, RSS < 40 MB, < 1 % of one core at 1 s, throughput ratio >= 0.99.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")

FAKE_EXPORTER = """
import sys, time
sys.path.insert(0, {tests!r})
from fake_nvml import FakeNVML
from kit.monitor.exporter import Exporter
from kit.monitor.gpu import GpuSource
from kit.monitor.node import NodeSource
from kit.monitor.training import TrainingSource
e = Exporter([GpuSource(FakeNVML(8), hostname="bench"), NodeSource(), TrainingSource(None)],
             interval=1.0, bind="127.0.0.1", port={port}, env={{"SLURM_JOB_ID": "1"}})
e.start()
print("ready", flush=True)
e.serve_forever()
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


def measure(pid: int, port: int, scrapes: int) -> dict:
    url = f"http://127.0.0.1:{port}/metrics"
    urllib.request.urlopen(url).read()
    # Background cost (polling), measured over a quiet 5 s.
    c0 = cpu_seconds(pid)
    time.sleep(5)
    idle_per_s = (cpu_seconds(pid) - c0) / 5
    lat = []
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    for _ in range(scrapes):
        s = time.perf_counter()
        body = urllib.request.urlopen(url).read()
        lat.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(pid) - c0 - idle_per_s * wall
    lat.sort()
    return {"p50": lat[len(lat) // 2], "p99": lat[int(len(lat) * 0.99) - 1], "cpu_per_scrape": max(cpu, 0) / scrapes,
            "idle_cpu_per_s": idle_per_s, "rss": rss_mb(pid), "series": body.count(b"\n") - body.count(b"\n#")}


def scrape_bench(scrapes: int) -> tuple[dict, dict | None]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", FAKE_EXPORTER.format(tests=str(REPO / "tests"), port=port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
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
        ne = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        try:
            wait_ready(port)
            node = measure(ne.pid, port, scrapes)
        finally:
            ne.terminate()
            ne.wait(10)
    return kit, node


def throughput_bench(jobs: int) -> tuple[list[float], list[float]]:
    from kit.cluster import LocalCluster

    home = Path(tempfile.mkdtemp(prefix="kit-bench-"))
    env = {**os.environ, "KIT_HOME": str(home)}
    cluster = LocalCluster(home)
    os.environ["KIT_HOME"] = str(home)
    cluster.up(nodes=2, cpus_per_node=2, prometheus=True)
    with_exp, without = [], []
    try:
        for _ in range(jobs):
            for exporter, bucket in ((True, with_exp), (False, without)):
                args = [sys.executable, "-m", "kit", "launch", "--local", "--nodes", "2", "--wait", "--json",
                        "--output-dir", str(home / "jobs")] + ([] if exporter else ["--no-exporter"]) + \
                       ["--", sys.executable, "-m", "kit.train", "--max-steps", "800", "--checkpoint-every", "0"]
                out = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
                job_dir = json.loads(out.stdout)["job_dir"]
                log = Path(job_dir, "logs", "rank-0.r0.log").read_text()
                bucket.append(float(re.search(r"throughput: ([0-9.]+) samples/s", log).group(1)))
    finally:
        cluster.down()
        shutil.rmtree(home, ignore_errors=True)
    return with_exp, without


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=300)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
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
    with_exp, without = throughput_bench(args.jobs)
    ratio = statistics.median(with_exp) / statistics.median(without)
    print(f"{'2-node job, samples/s per rank, with exporter':<46}{statistics.median(with_exp):>28.1f}  "
          f"{with_exp}")
    print(f"{'2-node job, samples/s per rank, without':<46}{statistics.median(without):>28.1f}  {without}")
    print(f"{'  throughput ratio (target >= 0.99)':<46}{ratio:>28.3f}")
    ok = kit["p99"] < 0.010 and kit["rss"] < 40 and share < 1.0 and ratio >= 0.99
    print("targets met" if ok else "TARGETS MISSED")


if __name__ == "__main__":
    main()
