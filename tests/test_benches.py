"""Every bench's --quick mode runs in the suite, so none rots (numbers are the bench's to print, never asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_bench_requeue_quick(cluster):
    proc = subprocess.run([sys.executable, str(BENCH / "bench_requeue.py"), "--quick", "--kit-home", str(cluster.home)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kit (prelaunch requeues, begin time released)" in proc.stdout, proc.stdout
