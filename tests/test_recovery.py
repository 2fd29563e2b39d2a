"""Hangs and dead daemons: each ends the job with the truth, and nothing is left.

Each test gets a throw-away 3-node cluster of its own (its own KIT_HOME), so
killing its daemons never touches the session's cluster.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import (
    check_end,
    hastened,
    kit,
    launch_wait,
    read_logs,
    release_requeued,
    require,
    scontrol,
    wait_for,
    wait_no_processes,
)

from kit import slurm
from kit.cluster import LocalCluster
from kit.cluster.processes import alive as _alive

# Checkpoints at 25, 50, ...: the tests stop ranks around logged steps 30 and 40, between saves.
TRAIN = [
    sys.executable,
    "-m",
    "kit.train",
    "--step-delay",
    "0.03",
    "--log-every",
    "10",
    "--checkpoint-every",
    "25",
    "--no-snapshots",
]


def hostnames(c: LocalCluster, nodelist: str) -> list[str]:
    return subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        env={**os.environ, **c.target.env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def trained_to(job_dir: Path, step: int, restart: int = 0):
    def check():
        path = job_dir / "logs" / f"rank-0.r{restart}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return any(int(s) >= step for s in re.findall(r"step=(\d+) loss", text))

    return check


def trainer_of_rank(job_dir: Path, rank: int) -> int:
    node, pid, *_ = (job_dir / "progress" / "r0" / f"task-{rank}").read_text().split()
    return int(pid)


def test_hung_rank_is_caught_dumped_and_requeued_off_its_node_and_its_goodput_adds_up(three, tmp_path):
    """A hang (run 0), then two preemptions (an admin's requeue in runs 1 and 2), then the finish: the hang is
    caught, dumped and left out; the job's time in goodput's parts adds up to its wall time, which the test's
    own clock brackets, and each part says what happened."""
    require("py-spy")
    launched_at = time.time()
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--hang-timeout",
        "5",
        "--first-progress-timeout",
        "120",
        command=[*TRAIN, "--max-steps", "300"],
        env=three.env,
    )
    wait_for(trained_to(w.job_dir, 40), 120, what="training")
    pid = wait_for(lambda: (w.job_dir / "progress" / "r0" / "task-1").exists() and trainer_of_rank(w.job_dir, 1), 10)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    report = w.job_dir / "hang" / "r0" / "report"
    wait_for(report.exists, 5 + 15, poll=0.1, what="the hang report")
    assert wait_for(
        lambda: slurm.job_status(three.target, w.job_id).restarts == 1,
        5 + 15 - (time.monotonic() - t0),
        poll=0.1,
        what="the step to stop and the job to requeue",
    )
    stopped_after = time.monotonic() - t0
    fields = dict(line.split("=", 1) for line in report.read_text().splitlines())
    suspect = fields["node"]
    assert fields["rank"] == "1" and suspect.startswith("node"), fields
    assert "process is stopped" in fields["summary"] or "T (stopped)" in fields["summary"], fields
    for rank in (0, 1):
        dump = (w.job_dir / "hang" / "r0" / f"rank-{rank}.txt").read_text()
        assert f"rank={rank} " in dump and "--- py-spy dump --pid" in dump and "MainThread" in dump, dump
    assert "state T (stopped)" in (w.job_dir / "hang" / "r0" / "rank-1.txt").read_text()
    wait_for(lambda: f"the next run leaves out {suspect}" in read_logs(w.job_dir), 15, what="the exclusion")
    assert f"hang: rank 1 on {suspect}" in read_logs(w.job_dir)
    assert suspect in slurm.job_status(three.target, w.job_id).excluded_nodes
    with hastened(three, w.job_id):
        for run in (1, 2):  # two preemptions: an admin's requeue, each run past its first save of its own
            wait_for(lambda: (w.job_dir / "progress" / f"r{run}").is_dir(), 90, what=f"run {run}")
            wait_for(trained_to(w.job_dir, 60 + 40 * run, restart=run), 120, what=f"run {run}'s training")
            scontrol(three, "requeue", w.job_id)
            release_requeued(three, w.job_id, w.job_dir, restarts=run + 1)
        err = check_end(
            three,
            w,
            state="COMPLETED",
            code=0,
            finished=True,
            log="done at step=300",
            ends=["hang", "stopped", "stopped", "finished"],
        )
    ended_at = time.time()
    assert "after 3 restart(s)" in err
    _check_goodput(three, w, err, launched_at, ended_at)
    assert suspect not in hostnames(three, slurm.job_status(three.target, w.job_id).nodes)
    resumed = int(
        re.search(r"resuming from .*last.ckpt at step (\d+)", (w.job_dir / "logs" / "rank-0.r1.log").read_text()).group(
            1
        )
    )
    assert resumed >= 25  # the save before the stop (every 25 steps; stopped after step 40)
    print(f"hang stopped and requeued {stopped_after:.1f} s after SIGSTOP (hang timeout 5 s)")


def _check_goodput(cluster, w, err: str, launched_at: float, ended_at: float) -> None:
    """The parts add up to the wall time; the wall time lies inside what the test saw (kit launch started before
    the submission; --wait returned after the end); each part is what happened."""
    import json

    report = kit("report", str(w.job_dir), "-o", str(w.job_dir.parent / "r.png"), env=cluster.env)
    assert report.returncode == 0, report.stderr
    g = json.loads((w.job_dir.parent / "r.json").read_text())["goodput"]
    parts, wall = g["parts"], g["wall_seconds"]
    assert abs(sum(parts.values()) - wall) <= 0.01 * wall, parts
    assert ended_at - launched_at - 3.0 <= wall <= ended_at - launched_at, (wall, ended_at - launched_at)
    assert g["runs"] == 4 and [r["end"] for r in g["per_run"]] == ["hang", "stopped", "stopped", "finished"]
    hang = g["per_run"][0]["hang"]
    assert 5.0 <= hang <= 5.0 + 15.0 and parts["hang"] == hang, g["per_run"][0]  # the 5 s timeout, the dump, the stop
    assert parts["redone"] > 0  # run 1 resumed from the save of step 25; run 0 had gone past step 40
    assert all(g["per_run"][i]["restart"] > 0 for i in range(3)) and "restart" not in g["per_run"][3]
    assert min(parts[p] for p in ("queue", "start", "init", "productive", "checkpoint")) > 0, parts
    assert parts["unreported"] == 0 and g["goodput"] == pytest.approx(
        parts["productive"] / (g["held_node_seconds"] / 2)
    )
    line = next(line for line in err.splitlines() if "goodput" in line)  # --wait's end line: the same numbers
    assert f"goodput {100 * g['goodput']:.1f}%: {parts['productive']:.1f} s trained of {wall:.1f} s" in line, line
    assert "goodput" + line.split("goodput", 1)[1] in report.stdout  # the report says it in the same words
    served = {}  # what the first node's exporter served (its log of each poll), the last poll's
    for path in sorted(w.job_dir.glob("logs/*.metrics.jsonl")):
        for line in path.read_text().splitlines():
            for name, labels, value in json.loads(line)["samples"]:
                if name.startswith("kit_job_goodput"):
                    served[path.name.split(".")[0], name, labels.get("part")] = value
    got = kit("events", str(w.job_dir), "--json", env=cluster.env)  # the same records, as one timeline
    run = ["started", "running", "first-step"]
    kinds = [e["kind"] for e in json.loads(got.stdout)]
    stopped = [*run, "run-ended", "stopped"]  # an admin's requeue: a stop signal ended the batch script
    want = [
        "submitted",
        *run,
        "hang",
        "run-ended",
        "requeued",
        *stopped,
        *stopped,
        *run,
        "run-ended",
        "exited",
        "ended",
    ]
    assert kinds == want, got.stdout
    text = kit("events", str(w.job_dir), env=cluster.env).stdout.splitlines()
    assert (
        text[0].endswith(f"submitted as job {w.job_id}")
        and "run 0   hang: rank 1 on node2 its process is T (stopped)" in text[4]
    ), text
    assert "ended COMPLETED (as Slurm gave it): " in text[-1] and "run 3   ended: finished, exit code 0" in text[-3], (
        text
    )
    assert text[-1].endswith(" s from submission to its end"), text
    (first,) = {node for node, _, _ in served}  # one node serves the job-wide numbers
    assert {p for _, _, p in served} == {*parts, None}, served
    assert 0 < served[first, "kit_job_goodput_ratio", None] < 1
    assert served[first, "kit_job_goodput_seconds", "hang"] == pytest.approx(hang, abs=0.01)


def test_killed_slurmd_comes_back_with_up_and_the_job_completes(three, tmp_path):
    w = launch_wait(tmp_path, "--nodes", "2", command=[*TRAIN, "--max-steps", "400"], env=three.env)
    wait_for(trained_to(w.job_dir, 30), 120, what="training")
    node = hostnames(three, slurm.job_status(three.target, w.job_id).nodes)[0]
    pids = dict(three.state().pids)
    os.kill(pids[node], signal.SIGKILL)
    wait_for(lambda: not _alive(pids[node], "slurmd"), 10)
    up = kit("cluster", "up", env=three.env)
    assert up.returncode == 0, up.stderr
    assert up.stdout.startswith("local cluster repaired: 3 node(s)"), up.stdout
    kept = up.stderr.split(f"restarting {node} (", 1)[1].split(" kept running)")[0].split(", ")
    assert {"munged", "slurmctld"} <= set(kept) and node not in kept, up.stderr
    assert three.state().pids["slurmctld"] == pids["slurmctld"]
    check_end(three, w, state="COMPLETED", code=0, finished=True, log="done at step=400", ends=["finished"])
    # Job ids go on after the repair, and after a full down/up.
    later = launch_wait(tmp_path, command=["true"], env=three.env)
    assert int(later.job_id) > int(w.job_id)
    later.finish()
    assert kit("cluster", "down", env=three.env).returncode == 0
    assert kit("cluster", "up", "--nodes", "3", "--cpus-per-node", "2", env=three.env).returncode == 0
    again = launch_wait(tmp_path, command=["true"], env=three.env)
    assert int(again.job_id) > int(later.job_id)
    assert again.finish()[0] == 0


def test_a_busy_controller_is_asked_again_and_wait_rides_through_a_restart(three, tmp_path):
    """A controller that answers nobody for 14 s (stopped: squeue gives up after MessageTimeout, 10 s): kit ps
    asks again and shows the running job, not a row it could not read. Then a restart: --wait and logs -f ride
    it, and say so."""
    # Steps for 45 s: past both silences.
    w = launch_wait(tmp_path, "--nodes", "2", command=[*TRAIN, "--max-steps", "1500"], env=three.env)
    wait_for(trained_to(w.job_dir, 20), 120, what="training")
    ctld = three.state().pids["slurmctld"]
    resume = threading.Timer(14, os.kill, (ctld, signal.SIGCONT))
    os.kill(ctld, signal.SIGSTOP)
    try:
        resume.start()
        asked_at = time.monotonic()
        ps = kit("ps", "--json", env=three.env)
        waited = time.monotonic() - asked_at
    finally:
        resume.cancel()
        os.kill(ctld, signal.SIGCONT)
    assert ps.returncode == 0, ps.stderr
    assert {r["id"]: r["state"] for r in json.loads(ps.stdout)}.get(w.job_id) == "RUNNING", ps.stdout
    assert waited >= 13, waited  # it did meet the silence
    # kit logs -f rides through it too, printing the job's lines all along.
    follow = subprocess.Popen(
        [sys.executable, "-m", "kit", "logs", "-f", str(w.job_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **three.env},
    )
    os.kill(ctld, signal.SIGKILL)
    wait_for(lambda: not _alive(ctld, "slurmctld"), 10)
    time.sleep(15)  # long enough for squeue to give up (it retries for ~9 s): --wait meets the outage
    assert follow.poll() is None, follow.communicate()
    up = kit("cluster", "up", env=three.env)
    assert up.returncode == 0 and "restarting slurmctld" in up.stderr, up.stderr
    err = check_end(three, w, state="COMPLETED", code=0, finished=True, log="done at step=1500", ends=["finished"])
    assert "slurmctld is not answering; still waiting" in err and "slurmctld answers again" in err
    out, ferr = follow.communicate(timeout=60)
    assert follow.returncode == 0, ferr
    assert "done at step=1500" in out and "slurmctld is not answering; still waiting" in ferr
    assert ferr.rstrip().endswith(f"kit: job {w.job_id} ended COMPLETED"), ferr


def test_down_with_a_dead_controller_ends_every_job_process(three, tmp_path):
    # A sidecar's daemon that cleared its environment and left the session: no token, no SLURM_CONF.
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--sidecar",
        "env -i setsid sleep 433 & exec sleep 300",
        command=[*TRAIN, "--max-steps", "100000"],
        env=three.env,
    )
    wait_for(trained_to(w.job_dir, 10), 120, what="training")
    os.kill(three.state().pids["slurmctld"], signal.SIGKILL)
    down = kit("cluster", "down", env=three.env)
    assert down.returncode == 0, down.stderr
    assert re.search(rf"ending \d+ leftover process\(es\) of job\(s\) {w.job_id}\b", down.stderr), down.stderr
    assert down.stdout == "local cluster stopped\n"
    assert wait_no_processes(w.job_dir, 5) == []
    assert not any(
        _alive(p, "slurmstepd") for p in _pids_named("slurmstepd") if f"SLURM_CONF={three.conf}".encode() in _environ(p)
    )
    assert not [p for p in _pids_named("sleep") if _cmdline(p) == b"sleep\x00433\x00"]
    w.proc.kill()
    w.proc.communicate()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _pids_named(comm: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().strip() == comm:
                    out.append(int(entry))
            except OSError:
                pass
    return out


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""
