"""launcher.sh run directly as one task would run it: signal delivery and exit codes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import task_env, wait_for

from kit import launch
from kit.core import spec as specs


def start(tmp_path: Path, command: list[str], extra_env: dict | None = None) -> tuple[subprocess.Popen, Path]:
    job = launch.resolve(specs.JobSpec(command=command, output_dir=str(tmp_path / "jobs")))
    job_dir = launch.prepare(job).job_dir
    env = task_env(job_dir, rank=1, ntasks=2, **(extra_env or {}))
    proc = subprocess.Popen(["bash", str(job_dir / "launcher.sh")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return proc, job_dir


LATE_HANDLER = ("import signal, sys, time\n"
                "print('started', flush=True); time.sleep(2)\n"
                "signal.signal(signal.SIGUSR1, lambda *a: (print('caught warning', flush=True), sys.exit(0)))\n"
                "print('handler installed', flush=True); time.sleep(60); sys.exit(9)\n")


def test_warning_waits_for_the_command_to_catch_it(tmp_path):
    proc, job_dir = start(tmp_path, [sys.executable, "-c", LATE_HANDLER])
    log = job_dir / "logs" / "rank-1.r0.log"
    wait_for(lambda: log.exists() and "started" in log.read_text(), 10, what="the command to start")
    proc.send_signal(signal.SIGUSR1)  # while the command has no handler yet
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert log.read_text().splitlines() == ["started", "handler installed", "caught warning"]


def test_warning_reaches_a_command_that_never_catches_it_after_the_grace(tmp_path):
    proc, job_dir = start(tmp_path, ["sleep", "60"], {"KIT_SIGNAL_GRACE": "1"})
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGUSR1)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGUSR1
    assert 0.9 < time.monotonic() - t0 < 10


def test_term_stops_the_command_and_is_not_recorded_as_a_failure(tmp_path):
    proc, job_dir = start(tmp_path, ["sleep", "60"])
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    _, rank, rc, how = (job_dir / "logs" / "exit.r0.rank-1").read_text().split()
    assert (rank, rc, how) == ("1", "143", "stopped")


def test_a_failing_command_is_recorded_for_prelaunch(tmp_path):
    proc, job_dir = start(tmp_path, ["bash", "-c", "exit 5"])
    proc.communicate(timeout=30)
    assert proc.returncode == 5
    (record,) = (job_dir / "logs").glob("exit.r0.rank-1")
    _, rank, rc, how = record.read_text().split()
    assert (rank, rc, how) == ("1", "5", "self")
