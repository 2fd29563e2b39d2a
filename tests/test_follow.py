"""Day two: kit logs and kit cancel on the real local cluster,
with SLURM_CONF unset (no `eval "$(kit cluster env)"`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from helpers import assert_nothing_left, release_requeued, runs, scontrol, state_is, submit, wait_for

import kit as kitlib
from kit import slurm
from kit.jobdir import trained


def env_without_slurm_conf() -> dict:
    """This process's environment (KIT_HOME set by the session's fixture) minus SLURM_CONF."""
    return {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}


def kit_plain(*args, cwd=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "kit", *args],
        capture_output=True,
        text=True,
        env=env_without_slurm_conf(),
        cwd=cwd,
        timeout=timeout,
    )


class W:  # what assert_nothing_left needs
    def __init__(self, job):
        self.job_id, self.job_dir = job["job_id"], Path(job["job_dir"])


def test_cancel_ends_a_running_job_and_records_who_and_why(cluster, tmp_path):
    job = submit(tmp_path, "--nodes", "2", command=["bash", "-c", "echo started; sleep 300"])
    wait_for(state_is(cluster, job["job_id"], "RUNNING"), 60, what="the job to run")
    wait_for(lambda: "started" in "".join(p.read_text() for p in Path(job["job_dir"], "logs").glob("rank-*")), 30)
    proc = kit_plain("cancel", job["job_id"], "--reason", "wrong learning rate", "--output-dir", str(tmp_path / "jobs"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"cancelled job {job['job_id']} (wrong learning rate); recorded in ")
    end = slurm.wait(cluster.target, job["job_id"], timeout=90)
    assert end.state == "CANCELLED"
    job_dir = Path(job["job_dir"])
    rec = json.loads((job_dir / "cancelled.json").read_text())
    assert rec["reason"] == "wrong learning rate" and rec["by"] and rec["time"] > 0
    assert not (job_dir / "FINISHED").exists()
    assert [r["end"] for r in runs(job_dir)] == ["stopped"]
    assert_nothing_left(cluster, W(job))
    again = kit_plain("cancel", str(job_dir))
    assert again.returncode == 1 and again.stderr.startswith(f"kit: JOB: job {job['job_id']} already ended (CANCELLED)")


FAIL_ON_RANK_1 = """
import os, sys, time
if os.environ["RANK"] == "1":
    def load(path):
        raise RuntimeError("checkpoint " + path + " is corrupt")
    try:
        load("/data/ckpt")
    except RuntimeError:
        import traceback
        traceback.print_exc()
        sys.exit(3)
print("rank 0 waiting", flush=True)
time.sleep(300)
"""


def test_logs_errors_names_the_first_failing_rank_its_node_code_and_traceback(cluster, tmp_path):
    job = submit(tmp_path, "--nodes", "2", "--step-wait", "5", command=[sys.executable, "-c", FAIL_ON_RANK_1])
    end = slurm.wait(cluster.target, job["job_id"], timeout=120)
    assert end.state == "FAILED"
    proc = kit_plain("logs", job["job_dir"], "--errors")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("run 0: rank 1 on node2 failed first, exit code 3, at "), proc.stdout
    body = "\n".join(lines[1:])
    assert "  Traceback (most recent call last):" in body and "in load" in body
    assert body.rstrip().endswith("RuntimeError: checkpoint /data/ckpt is corrupt")
    one = kit_plain("logs", job["job_dir"], "--rank", "1")
    assert one.stdout.startswith("Traceback (most recent call last):") or "Traceback" in one.stdout
    merged = kit_plain("logs", job["job_dir"])
    assert "0: rank 0 waiting" in merged.stdout and "1: RuntimeError: checkpoint /data/ckpt is corrupt" in merged.stdout
    node2 = kit_plain("logs", job["job_dir"], "--node", "node2")
    assert "rank 0 waiting" not in node2.stdout and "RuntimeError" in node2.stdout
    exporter = kit_plain("logs", job["job_dir"], "--sidecar", "exporter")
    assert exporter.returncode == 0, exporter.stderr
    expected = "".join(
        f"{f.name.split('.')[0]}: {line}\n"
        for f in sorted(Path(job["job_dir"], "logs").glob("*.r0.exporter.log"))
        for line in f.read_text().splitlines()
    )
    assert exporter.stdout == expected


TORCHRUN_CHILD = """
import os, time
if os.environ["RANK"] == "3":
    raise RuntimeError("boom from child rank 3")
time.sleep(30)
"""


def test_logs_errors_shows_a_torchrun_childs_error_and_rank_points_at_node(cluster, tmp_path):
    """Under torchrun (one task per node) --errors shows the child's
    RuntimeError, not only torchrun's ChildFailedError; --rank 3 (a child, not a kit rank)
    says kit's ranks are its tasks and points at --node."""
    (tmp_path / "child.py").write_text(TORCHRUN_CHILD)
    job = submit(
        tmp_path,
        "--nodes",
        "2",
        "--ntasks-per-node",
        "1",
        "--max-restarts",
        "0",
        command=[sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(tmp_path / "child.py")],
    )
    end = slurm.wait(cluster.target, job["job_id"], timeout=180)
    assert end.state == "FAILED"
    proc = kit_plain("logs", job["job_dir"], "--errors")
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeError: boom from child rank 3" in proc.stdout, proc.stdout
    child = proc.stdout.index("RuntimeError: boom from child rank 3")
    assert proc.stdout.rfind("Traceback (most recent call last):", 0, child) > 0  # its traceback, whole
    three = kit_plain("logs", job["job_dir"], "--rank", "3")
    assert three.returncode == 2 and three.stderr.startswith(
        "kit: --rank: run 0 has no rank 3: kit's ranks are its tasks, 0-1 here"
    ), three.stderr
    assert "kit logs --node NAME" in three.stderr


TORCHRUN_VICTIMS = """
import os, time, torch.distributed as dist
dist.init_process_group("gloo")
if os.environ["RANK"] == "3":
    time.sleep(2)
    raise RuntimeError("the real cause on child rank 3")
dist.barrier()
"""


def test_logs_errors_under_torchrun_shows_the_root_cause_before_its_victims(cluster, tmp_path):
    """Child rank 3 raises while the others wait in a barrier and then fail
    with "Connection closed by peer"; --errors names rank 3, its local rank and node first, and
    shows its traceback, not a victim's."""
    (tmp_path / "victims.py").write_text(TORCHRUN_VICTIMS)
    job = submit(
        tmp_path,
        "--nodes",
        "2",
        "--ntasks-per-node",
        "1",
        "--max-restarts",
        "0",
        "--no-exporter",
        command=[sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(tmp_path / "victims.py")],
    )
    end = slurm.wait(cluster.target, job["job_id"], timeout=180)
    assert end.state == "FAILED"
    node2 = (Path(job["job_dir"]) / "progress" / "r0" / "task-1").read_text().split()[0]
    proc = kit_plain("logs", job["job_dir"], "--errors")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith(
        f"run 0: rank 3 (local rank 1) on {node2}, exit code 1 (torchrun's root cause) failed first"
    ), proc.stdout
    assert "RuntimeError: the real cause on child rank 3" in proc.stdout and "Connection closed" not in proc.stdout
    api = kitlib.Job.from_dir(job["job_dir"]).logs(errors=True)
    assert api.startswith("run 0: rank 3 (local rank 1)") and "the real cause" in api


def test_logs_follow_reads_across_a_requeue_until_the_job_ends(cluster, tmp_path):
    script = (
        'echo "run $KIT_RESTART start"; if [ "$KIT_RESTART" = 0 ]; then sleep 300; fi; echo "run $KIT_RESTART done"'
    )
    job = submit(tmp_path, "--heartbeat", "0", command=["bash", "-c", script])
    follower = subprocess.Popen(
        [sys.executable, "-m", "kit", "logs", "-f", job["job_id"], "--output-dir", str(tmp_path / "jobs")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_without_slurm_conf(),
    )
    try:
        job_dir = Path(job["job_dir"])
        wait_for(
            lambda: (
                (job_dir / "logs" / "rank-0.r0.log").exists()
                and "run 0 start" in (job_dir / "logs" / "rank-0.r0.log").read_text()
            ),
            60,
            what="run 0",
        )
        scontrol(cluster, "requeue", job["job_id"])
        release_requeued(cluster, job["job_id"], job_dir)
        out, err = follower.communicate(timeout=120)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    assert "0: run 0 start" in out and "0: run 1 start" in out and "0: run 1 done" in out, out
    assert out.index("0: run 0 start") < out.index("0: run 1 done")
    assert f"kit: job {job['job_id']} ended COMPLETED" in err
    assert slurm.job_status(cluster.target, job["job_id"]).state == "COMPLETED"


def test_wait_on_a_terminal_shows_live_progress_and_ctrl_c_leaves_the_job_running(cluster, tmp_path):
    """Under `script` (a pty): the live line carries the step; Ctrl-C stops waiting only.
    The child starts with SIGINT ignored, as every child of a shell's background job does
    (`pytest ... &`: Python then installs no KeyboardInterrupt handler):
    kit launch --wait on a terminal puts Python's handler back."""
    import re
    import shlex
    import threading

    cmd = [
        sys.executable,
        "-m",
        "kit",
        "launch",
        "--local",
        "--wait",
        "--heartbeat",
        "0",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        sys.executable,
        "-m",
        "kit.train",
        "--max-steps",
        "100000",
        "--step-delay",
        "0.05",
    ]
    proc = subprocess.Popen(
        ["script", "-qfec", shlex.join(cmd), "/dev/null"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env_without_slurm_conf(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    out = bytearray()
    reader = threading.Thread(
        target=lambda: [out.extend(c) for c in iter(lambda: proc.stdout.read1(4096), b"")], daemon=True
    )
    reader.start()
    job_id = None
    try:
        wait_for(
            lambda: re.search(rb"kit: job \d+: RUNNING, run 0, step \d+/100000, loss [0-9.e-]+, \d+ samples/s", out),
            120,
            what="a progress line with a step",
        )
        job_id = re.search(rb"Submitted job (\d+)", out).group(1).decode()
        assert b"\r\x1b[K" in out  # one line, rewritten in place
        proc.stdin.write(b"\x03")  # Ctrl-C on the terminal
        proc.stdin.flush()
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:  # seen once in a full run: show where it stood
            tree = subprocess.run(
                ["ps", "-o", "pid,pgid,stat,wchan:20,args", "--ppid", str(proc.pid), "-g", str(os.getpgid(proc.pid))],
                capture_output=True,
                text=True,
            ).stdout
            code = f"still running after Ctrl-C:\n{tree}"
        assert code == 130, f"{code}\n{out.decode(errors='replace')}"
        reader.join(5)
        assert b"stopped waiting; the job goes on. Follow it: kit logs -f " in out
        assert slurm.job_status(cluster.target, job_id).state == "RUNNING"
        # The hint's cancel works as printed, from anywhere (the job went to a non-default --output-dir).
        hint = re.search(rb"cancel it: (kit cancel [^\r\n]+)", out).group(1).decode()
        done = kit_plain(*shlex.split(hint)[1:], "--reason", "the hint", cwd="/")
        assert done.returncode == 0, done.stderr
        assert slurm.wait(cluster.target, job_id, timeout=90).state == "CANCELLED"
    finally:
        proc.kill()
        if job_id:
            subprocess.run(["scancel", job_id], env={**os.environ, **cluster.target.env}, check=False)
            slurm.wait(cluster.target, job_id, timeout=90)


def _rank0(job_dir: Path) -> dict:
    return json.loads(next(job_dir.glob("metrics/*/rank-0.json")).read_text())


def test_ps_lists_a_running_and_a_finished_job_with_their_states_and_steps(cluster, tmp_path):
    """kit ps with SLURM_CONF unset; and with a Slurm that does not answer,
    the states come from the job directories (marked as such)."""
    train = [sys.executable, "-m", "kit.train"]
    done = submit(tmp_path, "--nodes", "2", command=[*train, "--max-steps", "30"])
    assert slurm.wait(cluster.target, done["job_id"], timeout=180).state == "COMPLETED"
    running = submit(tmp_path, "--nodes", "1", command=[*train, "--max-steps", "100000", "--step-delay", "0.05"])
    run_dir = Path(running["job_dir"])
    try:
        wait_for(lambda: trained.training_progress(run_dir).samples_per_second, 120, what="the running job's rate")
        before = _rank0(run_dir)["step"]
        proc = kit_plain("ps", "--json", cwd=tmp_path)  # the index: no --output-dir needed
        after = _rank0(run_dir)["step"]
        assert proc.returncode == 0, proc.stderr
        rows = {r["id"]: r for r in json.loads(proc.stdout)}
        r = rows[running["job_id"]]
        assert (r["state"], r["state_from"], r["active"], r["run"], r["max_steps"]) == (
            "RUNNING",
            "slurm",
            True,
            0,
            100000,
        ), r
        assert before <= r["step"] <= after and r["samples_per_second"] > 0 and r["nodes"] == "node1"
        f = rows[done["job_id"]]
        assert (f["state"], f["step"], f["max_steps"], f["finished"], f["active"]) == ("COMPLETED", 30, 30, True, False)
        assert (
            f["job_dir"] == str(Path(done["job_dir"]).resolve()) and f["loss"] == _rank0(Path(done["job_dir"]))["loss"]
        )
        ids = [r["id"] for r in json.loads(proc.stdout)]
        assert ids.index(running["job_id"]) < ids.index(done["job_id"])  # newest first
        text = kit_plain("ps", cwd=tmp_path).stdout.splitlines()
        assert text[0].split()[:6] == ["JOB", "NAME", "STATE", "NODES", "RUN", "STEP"]
        line = next(t.split() for t in text if t.split()[0] == running["job_id"])
        assert line[2:5] == ["RUNNING", "node1", "0"] and line[5].endswith("/100000")
        # The same jobs with their Slurm gone: the job directories tell what they can.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        for job, name in ((done, "done"), (running, "running")):
            copy = elsewhere / name
            # The running job writes while we copy: its atomic writers' temp files come and go.
            shutil.copytree(job["job_dir"], copy, symlinks=True, ignore=shutil.ignore_patterns(".*.tmp"))
            (copy / "slurm.json").write_text(json.dumps({"target": "local", "conf": str(tmp_path / "gone.conf")}))
        (elsewhere / "running" / "job_id").touch()  # newest
        rows = json.loads(kit_plain("ps", "--all", "--json", "--output-dir", str(elsewhere)).stdout)
        mine = {Path(r["job_dir"]).name: r for r in rows if Path(r["job_dir"]).parent == elsewhere.resolve()}
        assert mine["done"]["state"] == "COMPLETED" and mine["done"]["state_from"].startswith("job directory (slurm: ")
        assert mine["running"]["state"] == "UNKNOWN" and mine["running"]["step"] is not None
        text = kit_plain("ps", "--all", "--output-dir", str(elsewhere)).stdout
        assert f"{elsewhere / 'done'}" in text and "COMPLETED*" in text
    finally:
        kit_plain("cancel", running["job_id"], "--output-dir", str(tmp_path / "jobs"))
        slurm.wait(cluster.target, running["job_id"], timeout=90)
    rows = {r["id"]: r for r in json.loads(kit_plain("ps", "--json", cwd=tmp_path).stdout)}
    assert rows[running["job_id"]]["state"] == "CANCELLED" and not rows[running["job_id"]]["finished"]


def test_a_job_launched_after_eval_kit_cluster_env_is_followed_from_a_fresh_shell(cluster, tmp_path):
    """The README's `eval "$(kit cluster env)"`, then a plain `kit launch`
    (no --local); later, from a shell without SLURM_CONF, kit ps tells the job's true state
    and kit cancel cancels it."""
    env_line = kit_plain("cluster", "env").stdout.strip()
    assert env_line == f"export SLURM_CONF={cluster.conf}", env_line
    evaluated = {**env_without_slurm_conf(), "SLURM_CONF": str(cluster.conf)}
    proc = subprocess.run(
        [sys.executable, "-m", "kit", "launch", "--json", "--output-dir", str(tmp_path / "jobs"), "--", "sleep", "300"],
        capture_output=True,
        text=True,
        env=evaluated,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    job = json.loads(proc.stdout)
    assert json.loads((Path(job["job_dir"]) / "slurm.json").read_text()) == {
        "target": "local",
        "conf": str(cluster.conf),
    }
    try:
        wait_for(lambda: slurm.job_status(cluster.target, job["job_id"]).state == "RUNNING", 60, what="running")
        ps = kit_plain("ps", "--json", "--output-dir", str(tmp_path / "jobs"), cwd=tmp_path)
        row = next(r for r in json.loads(ps.stdout) if r["id"] == job["job_id"])
        assert (row["state"], row["state_from"]) == ("RUNNING", "slurm"), row
        done = kit_plain("cancel", job["job_dir"], cwd="/")
        assert done.returncode == 0, done.stderr
    finally:
        subprocess.run(["scancel", job["job_id"]], env={**os.environ, **cluster.target.env}, check=False)
    assert slurm.wait(cluster.target, job["job_id"], timeout=90).state == "CANCELLED"
