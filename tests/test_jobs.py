"""Real jobs on the real local cluster: submitted, run, ended and recorded as the README says."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import REPO, job_processes, kit, read_logs, submit, wait_for, wait_no_processes

from kit import slurm

TRAIN = [sys.executable, "-m", "kit.train"]


def rank_log(job_dir, rank: int, restart: int = 0) -> str:
    path = Path(job_dir, "logs", f"rank-{rank}.r{restart}.log")
    return path.read_text(errors="replace") if path.exists() else ""


def test_two_node_reference_training_completes(cluster, tmp_path):
    proc = kit(
        "launch",
        "--local",
        "--nodes",
        "2",
        "--wait",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        *TRAIN,
        "--max-steps",
        "40",
        "--log-every",
        "10",
        "--precision",
        "bf16-mixed",
        "--gradient-clip-val",
        "1.0",
        "--accumulate-grad-batches",
        "2",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    job_id = re.search(r"^Submitted job (\d+)$", proc.stdout, re.M).group(1)
    job_dir = re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1)
    assert f"kit: job {job_id} ended COMPLETED: the work finished (exit code 0)" in proc.stderr
    ranks = set()
    for rank in (0, 1):
        m = re.search(r"rank=(\d) world_size=(\d)", rank_log(job_dir, rank))
        assert m, rank_log(job_dir, rank)
        ranks.add(int(m.group(1)))
        assert m.group(2) == "2"
    assert ranks == {0, 1}
    m = re.search(r"done at step=40 first_loss=([0-9.]+) last_loss=([0-9.]+)", rank_log(job_dir, 0))
    assert m, rank_log(job_dir, 0)
    assert float(m.group(2)) < float(m.group(1))
    # The merged view carries every rank's lines, prefixed with the rank.
    merged = read_logs(job_dir)
    assert re.search(r"^0: kit.train\[rank 0\]: rank=0 world_size=2", merged, re.M)
    assert re.search(r"^1: kit.train\[rank 1\]: rank=1 world_size=2", merged, re.M)
    assert (Path(job_dir) / "FINISHED").exists()
    assert (Path(job_dir) / "checkpoints").is_dir()
    assert wait_no_processes(job_dir, 5) == []


def test_user_lightning_script_in_job_named_bash(cluster, tmp_path):
    """Lightning skips Slurm detection for jobs named bash; ranks must still be real."""
    proc = kit(
        "launch",
        "--local",
        "--nodes",
        "2",
        "--job-name",
        "bash",
        "--wait",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        sys.executable,
        str(REPO / "tests" / "user_lightning_script.py"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    job_dir = re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1)
    found = sorted(re.findall(r"user-script global_rank=(\d) world_size=(\d)", read_logs(job_dir)))
    assert found == [("0", "2"), ("1", "2")], read_logs(job_dir)


def test_failing_command_fails_the_job_and_leaves_nothing(cluster, tmp_path):
    proc = kit(
        "launch",
        "--local",
        "--nodes",
        "2",
        "--heartbeat",
        "1",
        "--wait",
        "--sidecar",
        "echo sidecar-started; exec sleep 300",
        "--sidecar",
        "watch: echo named; exec sleep 300",
        "--sidecar",
        "dies: sleep 0.5; exit 7",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "bash",
        "-c",
        "sleep 4; exit 3",
        cwd=tmp_path,
    )
    assert proc.returncode == 3, proc.stderr
    job_id = re.search(r"^Submitted job (\d+)$", proc.stdout, re.M).group(1)
    job_dir = re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1)
    assert f"kit: job {job_id} ended FAILED: the command failed with exit code 3 (exit code 3)" in proc.stderr
    st = slurm.job_status(cluster.target, job_id)
    assert (st.state, st.exit_code) == ("FAILED", 3)
    logs = read_logs(job_dir)
    assert "prelaunch] heartbeat" in logs
    sidecar_logs = sorted(Path(job_dir, "logs").glob("*.hook1.log"))
    assert [p.name for p in sidecar_logs] == ["node1.r0.hook1.log", "node2.r0.hook1.log"]
    assert all("sidecar-started" in p.read_text() for p in sidecar_logs)
    # `NAME: COMMAND` names a sidecar's log.
    named = sorted(Path(job_dir, "logs").glob("*.watch.log"))
    assert [p.name for p in named] == ["node1.r0.watch.log", "node2.r0.watch.log"]
    assert all(p.read_text() == "named\n" for p in named), [p.read_text() for p in named]
    # A sidecar that dies at once is said by --wait (as it is seen), kit ps and kit events, not only in its own log;
    # those the teardown stopped (hook1, watch, the exporter) are not.
    for node in ("node1", "node2"):
        said = f"sidecar dies on {node} ended by itself with exit code 7 (its log: logs/{node}.r0.dies.log)"
        assert said in proc.stderr.split(f"kit: job {job_id} ended FAILED")[0], proc.stderr
    told = [e for e in json.loads(kit("events", job_dir, "--json").stdout) if e["kind"] == "sidecar-ended"]
    assert sorted(e["text"].split(" ended")[0] for e in told) == ["sidecar dies on node1", "sidecar dies on node2"]
    (row,) = [
        r for r in json.loads(kit("ps", "--json", "--output-dir", str(tmp_path / "jobs")).stdout) if r["id"] == job_id
    ]
    assert sorted(row["sidecars_ended"]) == ["dies@node1 (exit 7)", "dies@node2 (exit 7)"], row
    assert wait_no_processes(job_dir, 5) == []
    assert not (Path(job_dir) / "FINISHED").exists()


def test_scancel_mid_run_stops_everything_within_5s(cluster, tmp_path):
    job = submit(
        tmp_path,
        "--nodes",
        "2",
        "--heartbeat",
        "1",
        "--sidecar",
        "exec sleep 300",
        command=[*TRAIN, "--max-steps", "100000", "--step-delay", "0.05", "--log-every", "5"],
    )
    job_dir = job["job_dir"]
    wait_for(lambda: "step=5 " in rank_log(job_dir, 0), 60, what="training to run")
    before = job_processes(job_dir)
    assert any("kit.train" in cmd for _, cmd in before) and any("sleep 300" in cmd for _, cmd in before)
    t0 = time.monotonic()
    subprocess.run(["scancel", job["job_id"]], env={**os.environ, **cluster.target.env}, check=True)
    left = wait_no_processes(job_dir, 5)
    elapsed = time.monotonic() - t0
    assert left == [], f"still running {elapsed:.1f} s after scancel: {left}"
    end = slurm.wait(cluster.target, job["job_id"], timeout=30)
    assert end.state == "CANCELLED"


def test_two_jobs_on_one_node_get_different_ports(cluster, tmp_path):
    args = ["--nodes", "1", "--ntasks-per-node", "2", "--sbatch-arg=--nodelist=node1"]
    cmd = [*TRAIN, "--max-steps", "60", "--step-delay", "0.05"]
    a = submit(tmp_path, *args, command=cmd)
    b = submit(tmp_path, *args, command=cmd)
    ends = [slurm.wait(cluster.target, j["job_id"], timeout=180) for j in (a, b)]
    assert [e.state for e in ends] == ["COMPLETED", "COMPLETED"], [read_logs(j["job_dir"]) for j in (a, b)]
    ports = []
    for j in (a, b):
        m = re.search(r"MASTER_ADDR=(\S+) MASTER_PORT=(\d+)", read_logs(j["job_dir"]))
        ports.append(int(m.group(2)))
        assert 29500 <= ports[-1] <= 30499
        assert "done at step=60" in rank_log(j["job_dir"], 0)
    assert ports[0] != ports[1]
    # They really shared the node at the same time.
    a, b = ends
    assert a.nodes == b.nodes == "node1"
    assert a.start_time <= b.end_time and b.start_time <= a.end_time


def test_killing_one_rank_ends_the_whole_job(cluster, tmp_path):
    job = submit(
        tmp_path,
        "--nodes",
        "2",
        "--step-wait",
        "10",
        "--sidecar",
        "exec sleep 300",
        command=[*TRAIN, "--max-steps", "100000", "--step-delay", "0.05", "--log-every", "5"],
    )
    job_dir = job["job_dir"]
    wait_for(lambda: "step=5 " in rank_log(job_dir, 0), 60, what="training to run")

    def rank1_trainer():
        for pid, cmd in job_processes(job_dir):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if "kit.train" in cmd and b"RANK=1" in environ:
                return pid
        return None

    pid = wait_for(rank1_trainer, 10, what="rank 1's trainer")
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    end = slurm.wait(cluster.target, job["job_id"], poll=0.2, timeout=10 + 15)
    elapsed = time.monotonic() - t0
    # The job's exit code is the killed rank's (137), not that of the rank srun stopped (143).
    assert (end.state, end.exit_code) == ("FAILED", 137)
    assert elapsed < 10, f"job took {elapsed:.1f} s to end after a rank died"
    assert wait_no_processes(job_dir, 5) == []


def test_prelaunch_runs_inside_salloc(cluster, tmp_path):
    """Interactive use: the same job directory run by hand inside an allocation."""
    proc = kit(
        "launch",
        "--dry-run",
        "--nodes",
        "2",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        sys.executable,
        "-c",
        "import os; print('salloc-rank', os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_PORT'])",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    job_dir = re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1)
    run = subprocess.run(
        ["salloc", "--nodes=2", "--ntasks-per-node=1", "bash", f"{job_dir}/prelaunch.sh"],
        env={**os.environ, **cluster.target.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    found = sorted(re.findall(r"salloc-rank (\d) (\d) (\d+)", run.stdout))
    assert [(r, w) for r, w, _ in found] == [("0", "2"), ("1", "2")], run.stdout + run.stderr
    assert "heartbeat" not in run.stdout + run.stderr


def test_debug_toggles_reach_every_rank(cluster, tmp_path):
    show = (
        "import os; print('debug-env', *(os.environ.get(k) for k in "
        "('DEBUG', 'NCCL_DEBUG', 'TORCH_DISTRIBUTED_DEBUG', 'CUDA_LAUNCH_BLOCKING', 'PYTHONFAULTHANDLER')))"
    )
    proc = kit(
        "launch",
        "--local",
        "--nodes",
        "2",
        "--debug",
        "--wait",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        sys.executable,
        "-c",
        show,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    job_dir = re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1)
    logs = read_logs(job_dir)
    # TORCH_DISTRIBUTED_DEBUG=INFO, not DETAIL: with DETAIL every DDP job segfaults in _ddp_init_helper
    # on torch 2.13 + gloo.
    assert sorted(re.findall(r"^(\d): debug-env (.*)$", logs, re.M)) == [
        ("0", "1 INFO INFO 1 1"),
        ("1", "1 INFO INFO 1 1"),
    ]
    assert "+ srun " in logs  # set -x in prelaunch
    # Each toggle can be chosen by itself: --env beats --debug.
    chosen = kit(
        "launch",
        "--local",
        "--debug",
        "--wait",
        "--env",
        "TORCH_DISTRIBUTED_DEBUG=OFF",
        "--env",
        "NCCL_DEBUG=WARN",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        sys.executable,
        "-c",
        show,
        cwd=tmp_path,
    )
    job_dir = re.search(r"^job dir: (.+)$", chosen.stdout, re.M).group(1)
    assert re.search(r"^0: debug-env 1 WARN OFF 1 1$", read_logs(job_dir), re.M), read_logs(job_dir)
    # A 2-node DDP job finishes under --debug.
    ddp = kit(
        "launch",
        "--local",
        "--nodes",
        "2",
        "--debug",
        "--wait",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        sys.executable,
        "-m",
        "kit.train",
        "--max-steps",
        "10",
        cwd=tmp_path,
        timeout=300,
    )
    job_dir = re.search(r"^job dir: (.+)$", ddp.stdout, re.M).group(1)
    assert ddp.returncode == 0, ddp.stderr + read_logs(job_dir)
    assert "done at step=10" in read_logs(job_dir)
    plain = kit(
        "launch",
        "--local",
        "--wait",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        sys.executable,
        "-c",
        show,
        cwd=tmp_path,
    )
    job_dir = re.search(r"^job dir: (.+)$", plain.stdout, re.M).group(1)
    assert re.search(r"^0: debug-env 0 None None None 1$", read_logs(job_dir), re.M)


def test_the_command_gets_default_signal_dispositions(cluster, tmp_path):
    """The launcher re-executes itself through perl or python3 to become a child subreaper; Python
    ignores SIGPIPE and SIGXFSZ at its start and ignored signals survive exec. The command
    must not inherit that (a pipe's reader gone must end a writer; gloo's sockets too)."""
    proc = kit(
        "launch",
        "--local",
        "--nodes",
        "2",
        "--wait",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "bash",
        "-c",
        'echo "sigign $(grep SigIgn /proc/self/status | cut -f2)"',
        cwd=tmp_path,
    )
    job_dir = re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1)
    assert proc.returncode == 0, proc.stderr + read_logs(job_dir)
    masks = [int(m, 16) for m in re.findall(r"^\d: sigign ([0-9a-f]+)$", read_logs(job_dir), re.M)]
    assert len(masks) == 2, read_logs(job_dir)
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        assert all(not mask >> (signum - 1) & 1 for mask in masks), (signum, [hex(m) for m in masks])
