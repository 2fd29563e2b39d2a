"""Every bench's --quick mode runs in the suite, so none rots. The
numbers are the bench's to print, never asserted here: a bench that no longer runs fails.
(bench_container.py's quick run is in test_containers.py, beside the image it needs.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import require

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run_bench(name: str, *args: str, timeout: float = 300) -> str:
    proc = subprocess.run(
        [sys.executable, str(BENCH / name), "--quick", *args], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_every_bench_has_a_quick_mode_run_here():
    here = {p.name for p in BENCH.glob("bench_*.py")} | {"gpu_check.py"}
    tested = {
        "bench_build.py",
        "bench_pack.py",
        "bench_launch.py",
        "bench_hang.py",
        "bench_exporter.py",
        "bench_requeue.py",
        "bench_container.py",
        "bench_snapshot.py",
        "bench_map.py",
        "bench_scale.py",
        "gpu_check.py",
        "bench_remote.py",
        "bench_failslow.py",
        "bench_notify.py",
        "bench_recovery.py",
    }  # bench_remote's quick run: tests/test_remote.py (its sshd)
    assert here == tested, f"a bench without a quick run in the suite: {here - tested}"
    for path in [*BENCH.glob("bench_*.py"), BENCH / "gpu_check.py"]:
        assert "--quick" in path.read_text(), path


def test_bench_build_quick():
    out = run_bench("bench_build.py")
    assert "tiny recipe from its Dockerfile" in out


def test_bench_pack_quick():
    out = run_bench("bench_pack.py")
    assert "default 'lz4' against enroot's" in out and "against 'zstd-fast' through FUSE" in out


def test_bench_launch_quick():
    require("slurmctld")
    out = run_bench("bench_launch.py")
    assert "kit launch --dry-run" in out and "ratio dry-run / python -c pass" in out
    assert "as users call them, a loop each" in out and "alternated, on an idle scheduler" in out
    assert "  submitit: submit(fn).result()" in out and "kit: result to result() returning" in out


def test_bench_hang_quick():
    require("slurmctld")
    require("py-spy")
    assert "last progress -> hang declared" in run_bench("bench_hang.py")


def test_bench_map_quick(cluster):
    out = run_bench("bench_map.py")
    assert "submit 50 items: kit.map" in out and "then [j.result() for j in jobs]" in out and "with 0 squeue(s)" in out


def test_bench_scale_quick():
    """2 and 4 nodes of a cluster of the bench's own: every line printed; what is not a timing is
    held here: the watchdog stats each rank's file at most once a poll and never lists the
    directory, and Prometheus has every node's exporter up."""
    require("slurmctld")
    require("prometheus")
    require("strace")
    out = run_bench("bench_scale.py", timeout=400)
    rows = [line for line in out.splitlines() if re.match(r" *\d+ nodes: ", line)]
    assert len(rows) == 2 and "teardown at 4 nodes:" in out and "kit's own growth" in out, out
    assert len(re.findall(r"(?m)^ *[24] nodes, batch script -> all running, each start \(s.*\): bare \d", out)) == 2, (
        out
    )
    assert (
        len(
            re.findall(
                r"(?m)^ *[24] nodes, a `true` job, command -> its return \(best of 1\): kit launch --wait "
                r"\d+\.\d+ s, srun \d+\.\d+ s$",
                out,
            )
        )
        == 2
    ), out
    assert re.search(r"(?m)^a `true` job, command -> its return, 2 -> 4 nodes .*: kit's own [-+]\d", out), out
    # the launchers' and sidecars' CPU is read in the scheduler's nanoseconds: never the clock ticks' 0
    assert int(re.search(r"kit's CPU per node to start a rank: (\d+) ms", out).group(1)) > 0, out
    for row, n in zip(rows, (2, 4)):
        per_rank = float(re.search(r"\(([\d.]+) per rank per poll, (\d+) polls\)", row).group(1))
        assert 0 < per_rank <= 1 and " 0 directory listing(s)" in row and f"targets {n}/{n} up" in row, row


def test_bench_exporter_quick():
    require("slurmctld")
    require("prometheus")
    out = run_bench("bench_exporter.py", timeout=400)
    assert "scrape latency p99" in out and "throughput ratio running/stopped" in out


def test_bench_requeue_quick(cluster):
    out = run_bench("bench_requeue.py", "--kit-home", str(cluster.home))
    assert "kit (prelaunch requeues, begin time released)" in out


def test_bench_failslow_quick(cluster):
    """bench_failslow's quick run on the session's cluster: the straggler named right, every measure printed."""
    out = run_bench("bench_failslow.py", "--kit-home", str(cluster.home), timeout=600)
    assert "the right rank and node named" in out and "verdict -> next run first step" in out, out
    right = next(line for line in out.splitlines() if line.startswith("the right rank and node named"))
    assert right.split()[-2] == "True", out
    assert "run end -> next run start (in the allocation)" in out, out
    clean = next(line for line in out.splitlines() if line.startswith("false verdicts in a clean run"))
    assert clean[56:66].strip() == "0", out  # no one named in 20 s of clean training (the requeue test has none)


def test_bench_notify_quick(cluster):
    """bench_notify's quick run on the session's cluster: every event once, within its target, the pages timed."""
    out = run_bench("bench_notify.py", "--kit-home", str(cluster.home), timeout=300)
    rows = {line[:56].strip(): line[56:].split() for line in out.splitlines() if len(line) > 56}
    assert rows["duplicates"][0] == "0" and rows["losses"][0] == "0", out
    assert int(rows["events delivered"][0]) >= 3, out  # started, first step, ended
    assert "job page, in Chromium, to its load event, median of 5:" in out and "64 nodes (a job directory)" in out, out
    assert rows["rank rows Chromium showed, 2 nodes / 64 nodes"][:3] == ["2", "/", "64"], out  # what the page shows


def test_bench_snapshot_quick():
    out = run_bench("bench_snapshot.py")
    assert "kit, next job, unchanged" in out and "--image pin" in out


def test_gpu_check_says_no_gpu_here_and_checks_the_exporter_on_the_test_library(tmp_path):
    """bench/gpu_check.py: here, with no GPU, it says so and exits 0; on the test
    NVML library (the real binding) its exporter check runs as on a GPU machine."""
    from fake_gpus import FakeGpus

    assert "no GPU: NVML sees none here" in run_bench("gpu_check.py")
    cpu = run_bench("gpu_check.py", "--cpu-path")  # step 2's machinery (launcher.sh by hand, teardown)
    assert "trainer path on CPU (2 ranks, gloo): ok" in cpu and "processes left after the ranks ended: 0" in cpu
    gpus = FakeGpus(tmp_path / "state").fail(7, "nvmlDeviceGetTotalEccErrors").write()
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gpu_check.py"), "--exporter-only"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **gpus.env()},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NVML: 8 GPU(s), driver kit-fake-nvml" in proc.stdout and "promtool check metrics: clean" in proc.stdout
    assert "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL                7/8 GPUs  (not supported on the others)" in proc.stdout
    gpus.fail(2, "nvmlDeviceGetPowerUsage").write()  # a value every GPU should have: the check fails
    bad = subprocess.run(
        [sys.executable, str(BENCH / "gpu_check.py"), "--exporter-only"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **gpus.env()},
    )
    assert bad.returncode == 1 and "DCGM_FI_DEV_POWER_USAGE                      7/8 GPUs  <- MISSING" in bad.stdout


def test_a_checkout_run_without_installing_finds_the_templates():
    """gpu_check.py is copied to a GPU box with the checkout and run there without installing kit
    (its `kit.templates` is the install's name for launch/): the templates are read from launch/."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from kit.core import bash; "
        "import importlib.util as u; print(u.find_spec('kit.templates') is None, "
        "bash.template('lib.sh') == open(sys.argv[1] + '/launch/lib.sh').read())"
    )
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code, str(BENCH.parent)], capture_output=True, text=True, timeout=60
    )  # -S: no site-packages, so not the editable install's finder
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"]


def test_bench_recovery_quick():
    """kit's checkpoints against today's last.ckpt on a throw-away 3-node cluster: a killed rank, a lost node."""
    require("slurmctld")
    out = run_bench("bench_recovery.py", timeout=600)
    for name in ("kit-rank", "kit-node", "today-node"):
        assert re.search(rf"^{name} +redone +\d+ step", out, re.M), out
    assert "a lost node to the next run's first step: today's (shared storage) / kit's (the peer's copy) =" in out, out
