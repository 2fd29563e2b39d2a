"""Arrays and sweeps: every task is its own unit of work, run on
the real local cluster."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import kit, launch_wait, read_logs, release_requeued, runs, wait_for

from kit import slurm

TRAIN = [sys.executable, "-m", "kit.train", "--log-every", "5", "--checkpoint-every", "5"]
MARK = 'printf "%s %s\\n" "$KIT_SWEEP_steps" "$1" >"$KIT_JOB_DIR/marker"; shift; exec "$@"'


def task_dir(w, i: int) -> Path:
    return w.job_dir / "tasks" / str(i)


def test_a_sweep_runs_every_task_one_at_a_time_and_reports_each(cluster, tmp_path):
    """Done-means 1: 3 tasks with %1; each its own directory, logs, checkpoints and
    marker; the failing middle task makes --wait non-zero, the others complete."""
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--sweep",
        "steps=10,bad,15",
        "--array",
        "%1",
        command=["bash", "-c", MARK, "_", "{steps}", *TRAIN, "--max-steps", "{steps}"],
    )
    rc, err = w.finish()
    assert rc == 2, err  # task 1's own exit code: argparse refused --max-steps bad
    lines = [line for line in err.splitlines() if line.startswith(f"kit: job {w.job_id}_")]
    assert lines == [
        f"kit: job {w.job_id}_0 (steps=10) ended COMPLETED: the work finished (exit code 0)",
        f"kit: job {w.job_id}_1 (steps=bad) ended FAILED: the command failed with exit code 2 (exit code 2)",
        f"kit: job {w.job_id}_2 (steps=15) ended COMPLETED: the work finished (exit code 0)",
    ], err
    assert f"kit: job {w.job_id}: 2 of 3 task(s) finished" in err
    for i, steps in ((0, "10"), (1, "bad"), (2, "15")):
        d = task_dir(w, i)
        assert (d / "marker").read_text() == f"{steps} {steps}\n"
        assert json.loads((d / "params.json").read_text()) == {"steps": steps}
        assert (d / "FINISHED").exists() == (steps != "bad")
        assert len(runs(d)) == 1
        assert {p.name for p in (d / "logs").glob("rank-*.log")} == {"rank-0.r0.log", "rank-1.r0.log"}
        if steps != "bad":
            assert f"done at step={steps}" in read_logs(d)
            # The task's last state, in its own directory: every rank's shard, sealed (kit's checkpoints).
            assert (d / "checkpoints" / f"step-{steps}" / "manifest.json").exists()
    # One at a time: each task started after the one before had ended.
    spans = [(runs(task_dir(w, i))[0]["time"], i) for i in range(3)]
    assert [i for _, i in sorted(spans)] == [0, 1, 2]
    assert not (w.job_dir / "FINISHED").exists() and not (w.job_dir / "checkpoints").exists()
    # kit report on the sweep: one table row per task, one figure, report.json.
    rep = kit("report", str(w.job_dir))
    assert rep.returncode == 0, rep.stderr
    rows = [line.split() for line in rep.stdout.splitlines()[2:5]]
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("0", "steps=10", "finished", "0"),
        ("1", "steps=bad", "failed", "0"),
        ("2", "steps=15", "finished", "0"),
    ], rep.stdout
    doc = json.loads((w.job_dir / "report.json").read_text())
    assert [t["params"] for t in doc["tasks"]] == [{"steps": "10"}, {"steps": "bad"}, {"steps": "15"}]
    assert (w.job_dir / "report.png").stat().st_size > 10_000
    # kit ps: one row per task (ID_TASK), each task's own state and step.
    ps = kit("ps", "--json", "--output-dir", str(tmp_path / "jobs"))
    assert ps.returncode == 0, ps.stderr
    tasks = {r["id"]: r for r in json.loads(ps.stdout) if r["job_dir"] == str(w.job_dir.resolve())}
    assert {k: (r["step"], r["finished"]) for k, r in tasks.items()} == {
        f"{w.job_id}_0": (10, True),
        f"{w.job_id}_1": (None, False),
        f"{w.job_id}_2": (15, True),
    }
    # The array's id: every task's logs, each line told by its task and rank (not "has not started").
    every = kit("logs", w.job_id, "--output-dir", str(tmp_path / "jobs"))
    assert every.returncode == 0, every.stderr
    assert "task 0: 0: " in every.stdout and "task 2: 1: " in every.stdout, every.stdout
    assert "`max_steps=15` reached" in every.stdout and "`max_steps=10` reached" in every.stdout, every.stdout
    # ID_TASK names one task for kit logs and kit report.
    one = kit("logs", f"{w.job_id}_2", "--output-dir", str(tmp_path / "jobs"))
    assert one.returncode == 0 and "`max_steps=15` reached" in one.stdout and "max_steps=10" not in one.stdout, (
        one.stderr
    )
    rep = kit("report", f"{w.job_id}_2", "--output-dir", str(tmp_path / "jobs"))
    assert rep.returncode == 0 and rep.stdout.startswith(f"job {w.job_id}_2 (data: "), rep.stderr
    none = kit("logs", f"{w.job_id}_7", "--output-dir", str(tmp_path / "jobs"))
    assert none.returncode == 2 and none.stderr.startswith(f"kit: JOB: job {w.job_id} has no task 7")


def _raw_id(d: Path) -> str:
    """The task's own Slurm job id, from its batch log."""
    text = "".join(p.read_text() for p in (d / "logs").glob("slurm-*.out"))
    return re.search(r"job (\d+) run 0", text).group(1)


def test_an_array_task_at_its_time_limit_requeues_and_resumes_alone(cluster, tmp_path):
    """Done-means 2: task 0 is warned before its time limit, checkpoints, requeues
    itself and resumes from its own checkpoint; task 1 (short) is untouched."""
    w = launch_wait(
        tmp_path,
        "--sweep",
        "steps=100000,20",
        "--time",
        "2",
        # Slurm sends the warning at its periodic check (every 30 s), up to 30 s before the lead: 60 s gives task 1
        # at least 30 s to start and make its 20 steps first (80 gave it 16 s; under load its start took 17).
        "--signal-lead",
        "60",
        "--heartbeat",
        "0",
        "--max-restarts",
        "2",
        command=[*TRAIN[:-2], "--checkpoint-every", "0", "--step-delay", "0.05", "--max-steps", "{steps}"],
    )
    try:
        t0, t1 = task_dir(w, 0), task_dir(w, 1)
        wait_for(
            lambda: (t0 / "logs" / "rank-0.r0.log").exists() and "requeueing" in read_logs(t0),
            180,
            what="task 0 to be warned and requeue itself",
        )
        raw = _raw_id(t0)
        saved = int(re.search(r"saved last.ckpt at step (\d+)", read_logs(t0)).group(1))
        release_requeued(cluster, raw, t0)
        wait_for(
            lambda: re.search(r"resuming from \S+ at step (\d+)", read_logs(t0)),
            90,
            what="task 0's second run to resume",
        )
        resumed = int(re.search(r"resuming from \S+ at step (\d+)", read_logs(t0)).group(1))
        assert resumed == saved and str(t0) in read_logs(t0)  # its own checkpoint, in its own directory
        # Task 1 ran once, to its end, in its own directory.
        assert [r["end"] for r in runs(t1)] == ["finished"] and (t1 / "FINISHED").exists()
        assert "done at step=20" in read_logs(t1) and not (t1 / "logs" / "rank-0.r1.log").exists()
        assert slurm.job_status(cluster.target, _raw_id(t1)).restarts == 0
    finally:
        subprocess.run(["scancel", w.job_id], env={**os.environ, **cluster.target.env}, check=False)
        rc, err = w.finish()
    assert rc != 0 and f"kit: job {w.job_id}_0 (steps=100000) ended CANCELLED after 1 restart(s)" in err, err


def test_sweep_input_is_checked_before_anything_is_submitted(tmp_path):
    cases = [
        (["--sweep", "lr"], "kit: --sweep: expected NAME=V1,V2,..., got 'lr'"),
        (["--sweep", "1x=2"], "kit: --sweep: not a parameter name: '1x'"),
        (["--sweep", "lr=1,1"], "kit: --sweep: lr: a value is given twice"),
        (["--sweep", "lr=1,2", "--", "echo", "{rate}"], "kit: command: {rate} in '{rate}' is not a sweep parameter"),
        (["--sweep", "lr=1,2", "--", "echo", "{"], "kit: command: a lone '{' in '{'"),
        (["--sweep", "lr=1,2", "--array", "0-5"], "kit: --array: the sweep has 2 task(s), 0-1; '0-5' names 5"),
        (["--array", "0-2000"], "kit: --array: index 2000 is above 1000"),
        (["--array", "5-1"], "kit: --array: empty range '5-1' in '5-1'"),
        (["--array", "1,x"], "kit: --array: not an index set: '1,x'"),
        (["--sbatch-arg=--array=0-3"], "kit: --sbatch-arg: --array is set by kit"),
        (["--sbatch-arg=-a3"], "kit: --sbatch-arg: -a is set by kit"),
    ]
    for args, first in cases:
        if "--" not in args:
            args = [*args, "--", "true"]
        proc = kit("launch", "--dry-run", "--output-dir", str(tmp_path / "jobs"), *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.splitlines()[0].startswith(first), (args, proc.stderr)
    assert not (tmp_path / "jobs").exists()


def test_a_hostile_sweep_value_reaches_the_command_byte_for_byte(tmp_path):
    value = "a b'$(touch PWNED)\"\\`x`;{}*\n\t\x7f é"
    proc = kit(
        "launch",
        "--dry-run",
        "--json",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--sweep",
        f"v=plain,{value}",
        "--",
        "printf",
        "<%s>",
        "pre-{v}-{{lit}}",
    )
    assert proc.returncode == 0, proc.stderr
    job_dir = Path(json.loads(proc.stdout)["job_dir"])
    words = (job_dir / "tasks" / "1" / "command").read_bytes().split(b"\0")
    assert words == [b"printf", b"<%s>", f"pre-{value}-{{lit}}".encode(), b""]
    assert (job_dir / "tasks" / "1" / "sweep").read_bytes() == f"v={value}".encode() + b"\0"
    # And through bash, as the launcher reads them (mapfile) and prelaunch exports them.
    out = subprocess.run(
        [
            "bash",
            "-c",
            'mapfile -d "" -t c <"$1/command"; while IFS= read -r -d "" kv; do '
            'export "KIT_SWEEP_${kv%%=*}=${kv#*=}"; done <"$1/sweep"; "${c[@]}"; '
            'printf "[%s]" "$KIT_SWEEP_v"',
            "_",
            str(job_dir / "tasks" / "1"),
        ],
        capture_output=True,
        cwd=tmp_path,
    )
    assert out.stdout == f"<pre-{value}-{{lit}}>[{value}]".encode()
    assert not list(tmp_path.rglob("PWNED"))


def test_cancelled_array_tasks_stay_cancelled_once_slurm_forgets_them(cluster, tmp_path):
    """`kit cancel ARRAY` records which tasks it ended; the job
    directory alone (what kit ps reads once Slurm forgets, MinJobAge later) then tells
    CANCELLED for those and COMPLETED for the task that had finished before."""
    from kit.job import listing
    from kit.jobdir import end_records

    w = launch_wait(tmp_path, "--sweep", "t=0,600", command=["sleep", "{t}"])
    wait_for(  # task 0 ended in Slurm, not only its work (FINISHED comes before its batch script's end)
        lambda: (
            (task_dir(w, 0) / "FINISHED").exists()
            and {i: st.state for i, st in slurm.array_status(cluster.target, w.job_id, [0, 1]).items()}
            == {0: "COMPLETED", 1: "RUNNING"}
        ),
        120,
        what="task 0 completed and task 1 running",
    )
    done = kit("cancel", str(w.job_dir), "--reason", "enough")
    assert done.returncode == 0, done.stderr
    assert json.loads((w.job_dir / end_records.CANCEL_RECORD).read_text())["tasks"] == [1]
    w.finish()
    # --wait kept the end Slurm gave each task (outcome.json): told the same way once Slurm forgets them.
    assert [json.loads((task_dir(w, i) / end_records.OUTCOME_RECORD).read_text())["state"] for i in (0, 1)] == [
        "COMPLETED",
        "CANCELLED",
    ]
    assert [end_records.recorded_state(task_dir(w, i)) for i in (0, 1)] == ["COMPLETED", "CANCELLED"]
    # Without it (a job no kit command saw end), the FINISHED marker and the cancel record tell the same.
    for i in (0, 1):
        (task_dir(w, i) / end_records.OUTCOME_RECORD).unlink()
    assert [end_records.recorded_state(task_dir(w, i)) for i in (0, 1)] == ["COMPLETED", "CANCELLED"]
    # kit ps's row for a task Slurm no longer knows (no status) comes from that record.
    rows = [listing._row(f"{w.job_id}_{i}", task_dir(w, i), w.job_dir, "n", None, None) for i in (0, 1)]
    assert [(r.state, r.state_from) for r in rows] == [("COMPLETED", "job directory"), ("CANCELLED", "job directory")]
    # kit ps: one row for the array, its tasks counted; --tasks a row per task.
    table = kit("ps", "--all", "--output-dir", str(w.job_dir.parent)).stdout.splitlines()
    mine = [line.split(None, 2) for line in table if line.startswith(f"{w.job_id} ") or line.startswith(f"{w.job_id}_")]
    assert len(mine) == 1 and mine[0][2].startswith("CANCELLED [1 CANCELLED, 1 COMPLETED]"), table
    expanded = kit("ps", "--all", "--tasks", "--output-dir", str(w.job_dir.parent)).stdout.splitlines()
    assert sorted(line.split()[0] for line in expanded if line.startswith(f"{w.job_id}_")) == [
        f"{w.job_id}_0",
        f"{w.job_id}_1",
    ]
