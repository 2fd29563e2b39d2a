"""Every bench's --quick mode runs in the suite, so none rots (issue 20 finding 7). The
numbers are the bench's to print, never asserted here: a bench that no longer runs fails.
(bench_container.py's quick run is in test_containers.py, beside the image it needs.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import require

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run_bench(name: str, *args: str, timeout: float = 300) -> str:
    proc = subprocess.run([sys.executable, str(BENCH / name), "--quick", *args], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_every_bench_has_a_quick_mode_run_here():
    here = {p.name for p in BENCH.glob("bench_*.py")}
    tested = {"bench_build.py", "bench_pack.py", "bench_launch.py", "bench_hang.py", "bench_exporter.py",
              "bench_requeue.py", "bench_container.py"}
    assert here == tested, f"a bench without a quick run in the suite: {here - tested}"
    for path in BENCH.glob("bench_*.py"):
        assert "--quick" in path.read_text(), path


def test_bench_build_quick():
    out = run_bench("bench_build.py")
    assert "tiny recipe from its Dockerfile" in out


def test_bench_pack_quick():
    out = run_bench("bench_pack.py")
    assert "default 'zstd-fast' against enroot's" in out


def test_bench_launch_quick():
    require("slurmctld")
    assert "kit launch --dry-run" in run_bench("bench_launch.py")


def test_bench_hang_quick():
    require("slurmctld")
    require("py-spy")
    assert "last progress -> hang declared" in run_bench("bench_hang.py")


def test_bench_exporter_quick():
    require("slurmctld")
    require("prometheus")
    out = run_bench("bench_exporter.py", timeout=400)
    assert "scrape latency p99" in out and "throughput ratio running/stopped" in out


def test_bench_requeue_quick(cluster):
    out = run_bench("bench_requeue.py", "--kit-home", str(cluster.home))
    assert "kit (prelaunch requeues, begin time released)" in out

