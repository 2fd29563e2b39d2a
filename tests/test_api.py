"""kit from Python: kit.launch, kit.Job, kit.jobs on the real local cluster."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from helpers import REPO, kit, wait_for

import kit as kitlib
from kit.cli.launch import launch as launch_command
from kit.job import handle
from kit.jobdir import JobDir


def test_a_plain_python_process_launches_follows_and_waits(cluster, tmp_path):
    """The shipped example, run as a user runs it: a 2-node reference-trainer job from a plain
    Python process; progress seen while it runs; wait() says COMPLETED, exit 0."""
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "launch" / "examples" / "api_quickstart.py"),
            "--max-steps",
            "300",
            "--output-dir",
            str(tmp_path / "jobs"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["state"] == "COMPLETED" and result["exit_code"] == 0, proc.stdout
    assert result["steps_seen"] and result["steps_seen"] == sorted(result["steps_seen"]), proc.stdout
    assert result["samples_per_second"] and result["samples_per_second"] > 0
    job = kitlib.Job.from_dir(next((tmp_path / "jobs").iterdir()))
    assert job.id == result["job_id"] and job.done() and job.state() == "COMPLETED"
    assert (job.dir / "FINISHED").exists() and job.progress().step == 300
    assert "0: " in job.logs() and "1: " in job.logs() and "world_size=2" in job.logs(rank=1)
    assert job.logs(errors=True) == ""
    assert job.id in [j.id for j in kitlib.jobs(output_dirs=[tmp_path / "jobs"])]


def test_cancel_from_python_is_the_outcome_tables_cancelled_row(cluster, tmp_path):
    job = kitlib.launch(["sleep", "300"], local=True, output_dir=tmp_path / "jobs", no_exporter=True)
    wait_for(lambda: job.state() == "RUNNING", 60, what="the job to run")
    record = job.cancel(reason="from a notebook")
    assert record["reason"] == "from a notebook"
    assert json.loads((job.dir / JobDir.CANCELLED).read_text())["reason"] == "from a notebook"

    async def follow():
        return await job  # awaitable, for asyncio code

    end = asyncio.run(follow())
    assert (end.state, end.exit_code) == ("CANCELLED", 80), end
    assert job.wait() == end and not (job.dir / "FINISHED").exists()
    with pytest.raises(kitlib.KitError, match="already ended"):
        job.cancel()


def test_every_launch_option_is_a_keyword_with_the_commands_checks(tmp_path):
    """The keywords are derived from the command's options (dashes as underscores), and a bad
    value raises kit.KitError with the command's message and field."""
    flags = {max(p.opts, key=len) for p in launch_command.params if p.name not in ("help", "command")}
    flags |= {p.secondary_opts[0] for p in launch_command.params if p.secondary_opts and p.name != "help"} - {
        "--no-debug",
        "--no-container-mount-home",
    }  # the off side of a switch is debug=False
    assert {f.lstrip("-").replace("-", "_") for f in flags} == set(handle.python_names())
    bad = [
        ({"nodes": 0}, ["--nodes", "0"]),
        ({"mem": "lots"}, ["--mem", "lots"]),
        ({"time": "1:2:3:4"}, ["--time", "1:2:3:4"]),
        ({"env": {"RANK": "3"}}, ["--env", "RANK=3"]),
        ({"sbatch_arg": ["--nodes=3"]}, ["--sbatch-arg=--nodes=3"]),
        ({"port_range": "9-1"}, ["--port-range", "9-1"]),
        ({"signal": "KILL"}, ["--signal", "KILL"]),
        (
            {"mount": ["relative:/x"], "image": str(tmp_path / "none.sqsh")},
            ["--mount", "relative:/x", "--image", str(tmp_path / "none.sqsh")],
        ),
        ({"sweep": ["lr"]}, ["--sweep", "lr"]),
        ({"after": ["x:maybe"]}, ["--after", "x:maybe"]),
    ]
    for keywords, argv in bad:
        with pytest.raises(kitlib.KitError) as e:
            kitlib.launch(["true"], dry_run=True, output_dir=str(tmp_path / "jobs"), **keywords)
        proc = kit("launch", "--dry-run", "--output-dir", str(tmp_path / "jobs"), *argv, "--", "true")
        assert proc.returncode == 2, (argv, proc.stderr)
        assert proc.stderr.splitlines()[0] == f"kit: {e.value.field}: {e.value.message}", (keywords, proc.stderr)
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())
    with pytest.raises(kitlib.KitError, match=r"unknown option 'nodez': did you mean nodes\?"):
        kitlib.launch(["true"], nodez=2)
    with pytest.raises(kitlib.KitError, match="expected a whole number"):
        kitlib.launch(["true"], nodes="2", dry_run=True)
    job = kitlib.launch(
        "echo $RANK",
        dry_run=True,
        output_dir=tmp_path / "ok",
        nodes=2,
        env={"A": "1"},
        no_exporter=True,
        sweep={"lr": [0.1, 0.01]},
        debug=True,
    )
    spec = json.loads((job.dir / JobDir.SPEC).read_text())
    assert job.id is None and spec["command"] == ["bash", "-c", "echo $RANK"] and spec["exporter"] is False
    assert spec["sweep"] == {"lr": ["0.1", "0.01"]} and spec["env"] == {"A": "1"} and spec["debug"] is True


def test_a_function_runs_on_every_rank_as_one_world(cluster, tmp_path):
    """kit.submit(fn) on 2 nodes x 2 tasks, fn all-reducing its rank with gloo:
    one world of 4, every rank's return value; rank 0's is job.result()."""

    def all_reduce(offset):
        import os

        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        t = torch.tensor([int(os.environ["RANK"]) + offset])
        dist.all_reduce(t)
        out = {
            "rank": dist.get_rank(),
            "world": dist.get_world_size(),
            "sum": int(t.item()),
            "node": os.environ["SLURMD_NODENAME"],
        }
        dist.destroy_process_group()
        return out

    job = kitlib.submit(
        all_reduce, 10, nodes=2, ntasks_per_node=2, local=True, output_dir=tmp_path / "jobs", no_exporter=True
    )
    results = job.results(timeout=300)
    assert [r["rank"] for r in results] == [0, 1, 2, 3] and {r["world"] for r in results} == {4}
    assert {r["sum"] for r in results} == {0 + 1 + 2 + 3 + 4 * 10}
    assert {r["node"] for r in results} == {"node1", "node2"}
    # The values come as soon as every rank returned; the job's end (teardown, FINISHED) follows.
    assert job.result() == results[0]
    assert job.wait().exit_code == 0 and (job.dir / "FINISHED").exists()
    # A result is a pickle, so code: it is loaded only from a file of the caller's own.
    os.chown(JobDir(job.dir).result(2), 4321, 4321)
    with pytest.raises(kitlib.KitError, match="not this user's own"):
        job.results()


def test_an_exception_on_a_rank_comes_back_naming_it(cluster, tmp_path):
    def fails_on_rank_1():
        import os

        if os.environ["RANK"] == "1":
            raise ValueError("bad shard 7")
        return "ok"

    job = kitlib.submit(fails_on_rank_1, nodes=2, local=True, output_dir=tmp_path / "jobs", no_exporter=True)
    with pytest.raises(kitlib.RemoteError) as e:
        job.result(timeout=300)
    assert e.value.rank == 1 and e.value.node == "node2" and e.value.type == "ValueError"
    assert "rank 1 on node2 raised ValueError: bad shard 7" in str(e.value)
    # Where it failed is in the message itself (file, line, function, source).
    assert re.search(
        r'File ".*test_api.py", line \d+, in fails_on_rank_1\n +raise ValueError\("bad shard 7"\)', str(e.value)
    ), str(e.value)
    assert 'raise ValueError("bad shard 7")' in e.value.traceback
    end = job.wait()
    assert end.state == "FAILED" and end.exit_code == 1 and not (job.dir / "FINISHED").exists()


def test_a_function_job_whose_python_differs_is_refused_before_submitting(tmp_path):
    """The image's python3 must be this Python's minor version, with cloudpickle: read from the
    image's file list, refused with one line, nothing written or submitted."""
    root = tmp_path / "root"
    for rel in ("usr/bin/python3.9", "usr/bin/bash", "usr/bin/tee"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    image = tmp_path / "old.sqsh"
    subprocess.run(["mksquashfs", str(root), str(image), "-quiet", "-no-progress"], check=True)
    with pytest.raises(kitlib.KitError) as e:
        kitlib.submit(print, "x", image=str(image), local=True, output_dir=tmp_path / "jobs")
    assert (
        e.value.field == "--image" and "has python3.9, this Python is %d.%d" % sys.version_info[:2] in e.value.message
    )
    (root / "usr/bin/python3.9").rename(root / ("usr/bin/python%d.%d" % sys.version_info[:2]))
    image.unlink()
    subprocess.run(["mksquashfs", str(root), str(image), "-quiet", "-no-progress"], check=True)
    with pytest.raises(kitlib.KitError, match="has no cloudpickle"):
        kitlib.submit(print, "x", image=str(image), local=True, output_dir=tmp_path / "jobs")
    assert not (tmp_path / "jobs").exists()
    with pytest.raises(kitlib.KitError, match="cannot pickle"):
        import threading

        kitlib.submit(print, threading.Lock(), local=True, output_dir=tmp_path / "jobs")


def test_a_wait_ends_once_the_callers_own_check_holds_between_its_polls():
    """slurm.wait's ``until`` (a function job's "every rank returned"): asked between the controller's polls, so
    the wait ends within a tenth of a second of it, not at the next poll (5 s here); None says which end it was."""
    from kit.slurm import status

    asked, t0 = [], time.monotonic()
    out = status.follow(
        lambda: asked.append(1),
        what="job 1",
        poll=5.0,
        timeout=60,
        outage=60,
        on_outage=None,
        until=lambda: time.monotonic() - t0 > 0.6,
    )
    assert out is None and time.monotonic() - t0 < 2.5 and 1 <= len(asked) <= 6, asked


def test_map_runs_one_task_per_item_and_returns_results_in_order(cluster, tmp_path, monkeypatch):
    """The tasks' Jobs share one squeue per poll for the whole array
    (never one per item), and a task seen final is never asked for again."""
    from kit.slurm import status as slurm_status

    asked, squeue = [], slurm_status._squeue_jobs
    monkeypatch.setattr(
        slurm_status, "_squeue_jobs", lambda target, patience: asked.append(1) or squeue(target, patience)
    )
    t0 = time.monotonic()
    jobs = kitlib.map(lambda x: x * x, [3, 1, 4, 1, 5], local=True, output_dir=tmp_path / "jobs", no_exporter=True)
    assert len(jobs) == 5 and len({j.id.split("_")[0] for j in jobs}) == 1  # one array job
    assert [j.result(timeout=300) for j in jobs] == [9, 1, 16, 1, 25]  # (each as soon as its call returned)
    assert all(j.wait(timeout=300).exit_code == 0 and (j.dir / "FINISHED").exists() for j in jobs)
    assert len(asked) <= time.monotonic() - t0 + 2, asked  # one a second at most, whatever the items
    before = len(asked)
    assert all(j.wait().exit_code == 0 for j in jobs)
    assert len(asked) == before  # all five known final: no squeue at all
    with pytest.raises(kitlib.KitError, match="one task per item"):
        kitlib.map(abs, [1], array="0-3")
    # A rerun of a kit.map task runs that task's call again, as a job of its own.
    again = jobs[2].rerun()
    assert again.result(timeout=300) == 16 and again.dir.parent == tmp_path / "jobs"


def test_a_function_job_reruns_and_a_rank_that_never_returned_is_not_finished(cluster, tmp_path):
    """kit rerun of a kit.submit job returns the function's result again;
    a function that leaves through os._exit(0) is not "the work finished"."""

    def answer(x):
        return x + 1

    job = kitlib.submit(answer, 41, local=True, output_dir=tmp_path / "jobs", no_exporter=True)
    assert job.result(timeout=300) == 42
    proc = kit("rerun", str(job.dir), "--wait", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    again_dir = proc.stdout.split("job dir: ")[1].splitlines()[0].strip()
    with pytest.raises(kitlib.KitError, match="kit.FunctionJob"):  # a plain Job says where a function job's results are
        kitlib.Job.from_dir(again_dir).result()
    again = kitlib.FunctionJob.from_dir(again_dir)
    assert again.dir != job.dir and again.result(timeout=300) == 42

    def leaves():
        import os

        os._exit(0)

    gone = kitlib.submit(leaves, nodes=2, local=True, output_dir=tmp_path / "jobs", no_exporter=True)
    end = gone.wait(timeout=300)
    assert (end.state, end.exit_code) == ("FAILED", 70) and not (gone.dir / "FINISHED").exists(), end
    assert (
        "not every rank returned from the function" in (gone.dir / "logs").joinpath(f"slurm-{gone.id}.out").read_text()
    )
    deep = kit(
        "rerun", str(job.dir), "--edit", "nodes=" + "[" * 2000, cwd=tmp_path
    )  # a TOML value nested past Python's limit: refused, no traceback
    assert deep.returncode == 2 and deep.stderr.startswith("kit: --edit: nodes: the value is nested too deep")
    assert "Traceback" not in deep.stderr


def test_rerun_submits_the_resolved_spec_again_with_edits(cluster, tmp_path):
    """kit rerun of a finished job: the same resolved spec but for --edit, a new directory, the
    same Slurm; kit ps --json and kit.jobs() say which job it reruns."""
    first = kitlib.launch(
        [sys.executable, "-m", "kit.train", "--max-steps", "20"],
        local=True,
        output_dir=tmp_path / "jobs",
        env={"A": "1"},
        wait=True,
    )
    assert first.wait().exit_code == 0
    proc = kit("rerun", str(first.dir), "--edit", "nodes=2", "--wait", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    new_dir = tmp_path / "jobs" / proc.stdout.split("job dir: ")[1].split("/")[-1].strip()
    old_spec, new_spec = (json.loads((d / JobDir.SPEC).read_text()) for d in (first.dir, new_dir))
    assert new_spec.pop("nodes") == 2 and old_spec.pop("nodes") == 1 and new_spec == old_spec
    assert (new_dir / "FINISHED").exists() and new_dir != first.dir
    # A rerun is a new job, so a new tracker run; it records the one it reruns.
    assert JobDir(new_dir).tracker_run_id == new_dir.name != JobDir(first.dir).tracker_run_id
    assert json.loads((new_dir / JobDir.RERUN_OF).read_text())["tracker_run_id"] == first.dir.name
    rows = json.loads(kit("ps", "--json", "--output-dir", str(tmp_path / "jobs")).stdout)
    assert {r["job_dir"]: r["rerun_of"] for r in rows}[str(new_dir.resolve())] == first.id
    again = first.rerun(wait=True, time=30)
    assert json.loads((again.dir / JobDir.SPEC).read_text())["time"] == "30" and again.wait().exit_code == 0
    with pytest.raises(kitlib.KitError, match="unknown field 'nodez'"):
        first.rerun(nodez=3)
    (first.dir / JobDir.SPEC).chmod(0o666)  # someone else could have written it: its spec is not run
    with pytest.raises(kitlib.KitError, match="not this user's own"):
        first.rerun()


def test_a_held_job_on_the_host_runs_the_code_it_was_submitted_with(cluster, tmp_path):
    """On the host: launched from a subdirectory of a git work tree with
    an uncommitted change and an untracked module; edited while held, it runs what was
    submitted, started at the same place in the snapshot; job.json says the tree was dirty."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "train.py").write_text("import helper\nprint('code', helper.VERSION)\n")

    def run(*a):
        return subprocess.run(
            ["git", "-C", str(repo), "-c", "user.email=t@kit", "-c", "user.name=t", *a],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    run("init", "-q")
    run("add", "pkg/train.py")
    run("commit", "-qm", "one")
    (repo / "pkg" / "train.py").write_text("import helper\nprint('code', helper.VERSION, 'edited')\n")
    (repo / "pkg" / "helper.py").write_text("VERSION = 'v1'\n")  # untracked, not ignored: in the snapshot
    proc = kit(
        "launch",
        "--local",
        "--no-exporter",
        "--sbatch-arg=--hold",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        sys.executable,
        "train.py",
        cwd=repo / "pkg",
    )
    assert proc.returncode == 0, proc.stderr
    job = kitlib.Job.from_dir(proc.stdout.split("job dir: ")[1].strip())
    (repo / "pkg" / "helper.py").write_text("VERSION = 'v2'\n")
    (repo / "pkg" / "train.py").write_text("print('something else')\n")
    cluster_env = {**os.environ, **cluster.target.env}
    subprocess.run(["scontrol", "release", job.id], env=cluster_env, check=True)
    assert job.wait(timeout=180).exit_code == 0
    assert "0: code v1 edited" in job.logs(), job.logs()
    snap = json.loads((job.dir / JobDir.SPEC).read_text())["snapshot"]
    assert snap["dirty"] is True and snap["commit"] == run("rev-parse", "HEAD") and snap["files"] == 2
    assert json.loads((job.dir / JobDir.SBATCH).read_text())[2] == f"--chdir={job.dir / 'code' / 'pkg'}"


def test_job_logs_errors_reads_only_the_end_of_a_huge_log(tmp_path):
    """Job.logs(errors=True) and `kit logs --errors` are one library call: on a 500 MB rank log
    both read its end only (Python's own allocations a few MB; the command's whole process under
    50 MB resident), and say the same."""
    import tracemalloc

    job = tmp_path / "job"
    (job / "logs").mkdir(parents=True)
    (job / "progress" / "r0").mkdir(parents=True)
    (job / "progress" / "r0" / "task-1").write_text("node2 123 0\n")
    (job / "logs" / "exit.r0.rank-1").write_text("1700000000000000000 1 3 self\n")
    (job / "logs" / "exit.r0.rank-0").write_text("1700000001000000000 0 0 self\n")
    (job / "logs" / "rank-0.r0.log").write_text("fine\n")
    (job / "job_id").write_text("999999\n")
    with open(job / "logs" / "rank-1.r0.log", "wb") as f:
        f.truncate(500 << 20)  # 500 MB (sparse: the disk holds its end only)
        f.seek(0, os.SEEK_END)
        f.write(b"\n" + (b"x" * 99 + b"\n") * 1000)
        f.write(b'Traceback (most recent call last):\n  File "t.py", line 1\nValueError: the end\n')
    tracemalloc.start()
    text = kitlib.Job.from_dir(job).logs(errors=True)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert text.startswith("run 0: rank 1 on node2 failed first, exit code 3, at ") and text.endswith(
        "ValueError: the end"
    )
    assert peak < 4 << 20, peak
    # The command's peak resident memory, from a small parent (a fork of pytest would carry its size
    # until exec into ru_maxrss): it forks, execs kit, and reports wait4's rusage.
    wrapper = (
        "import os, sys\npid = os.fork()\nif pid == 0:\n    os.execv(sys.executable, sys.argv[1:])\n"
        "_, status, usage = os.wait4(pid, 0)\nprint(os.waitstatus_to_exitcode(status), usage.ru_maxrss, "
        "file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-S", "-c", wrapper, sys.executable, "-m", "kit", "logs", str(job), "--errors"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    code, peak_kib = map(int, proc.stderr.split()[-2:])
    assert code == 0 and proc.stdout.rstrip("\n") == text, proc.stderr
    assert peak_kib < 50 << 10, f"kit logs --errors peaked at {peak_kib >> 10} MiB resident"


def test_a_rerun_without_a_snapshot_whose_directory_is_gone_is_refused_before_submission(cluster, tmp_path):
    """`kit rerun --edit code_snapshot=false` (kit's hint when a snapshot is gone) runs the code where the
    job was launched: that directory gone, it is refused in one line (it submitted a job that ended 127)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "run.sh").write_text("echo ran\n")
    first = kit(
        "launch",
        "--local",
        "--no-exporter",
        "--wait",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "bash",
        "run.sh",
        cwd=work,
    )
    assert first.returncode == 0, first.stderr
    job_dir = first.stdout.split("job dir: ")[1].splitlines()[0].strip()
    shutil.rmtree(work)
    before = sorted((tmp_path / "jobs").iterdir())
    proc = kit("rerun", job_dir, "--edit", "code_snapshot=false", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"kit: --edit code_snapshot: the job would run its code in {work}, which is gone",
        "hint: launch it anew from where its code is now (kit launch … from that directory)",
    ], proc.stderr
    assert sorted((tmp_path / "jobs").iterdir()) == before  # nothing written, nothing submitted


def test_a_result_waited_for_says_the_job_is_pending_and_why(cluster, tmp_path, capfd):
    """kit.submit(fn).result() on a held job: standard error says, while it waits, that the job waits to start,
    why (Slurm's reason) and how to release it — once, however often it is asked."""
    job = kitlib.submit(lambda: 1, local=True, output_dir=tmp_path / "jobs", no_exporter=True, sbatch_arg=["--hold"])
    try:
        with pytest.raises(kitlib.KitError, match="has not ended after 4 s"):
            job.result(timeout=4)
    finally:
        job.cancel()
    err = capfd.readouterr().err
    assert err.count(f"kit: job {job.id} is waiting to start: PENDING, held (JobHeldUser)") == 1, err
    assert f"release it with `scontrol release {job.id}`" in err, err


def test_a_held_job_says_so_with_the_release_command_and_its_rerun_runs(cluster, tmp_path):
    """`--wait`, `kit ps` and Job.state() say a held job is held and how to
    release it; `kit rerun` of a job launched with --hold runs (the hold was that submission's)."""
    from helpers import launch_wait, scancel

    w = launch_wait(tmp_path, "--no-exporter", "--sbatch-arg=--hold", command=["true"])
    try:
        job = kitlib.Job.from_dir(w.job_dir)
        wait_for(lambda: job.state() == "PENDING" and job.state().note, 60, what="the job to be seen held")
        assert f"release it with `scontrol release {w.job_id}`" in job.state().note
        assert "held (JobHeldUser)" in repr(job.state())
        rows = kit("ps", "--output-dir", str(tmp_path / "jobs")).stdout
        assert f"JobHeldUser: release it with scontrol release {w.job_id}" in rows, rows
        again = job.rerun(wait=True)
        assert (
            again.wait().exit_code == 0
            and "--hold" not in json.loads((again.dir / JobDir.SPEC).read_text())["sbatch_args"]
        )
    finally:
        scancel(cluster, w.job_id)
    code, err = w.finish()
    assert (
        f"kit: job {w.job_id}: PENDING, held (JobHeldUser): it never starts by itself; release it with "
        f"`scontrol release {w.job_id}`" in err
    ), err
    assert code == 80


def _spelled(kwargs: dict) -> list[str]:
    """The command line a person types for ``kwargs`` (one option's shape)."""
    from kit.core import jobfile, keywords, options

    given, where = keywords.fields(kwargs)
    argv = [f"--{where}"] if where else []
    for name, value in given.items():
        o = options.BY_NAME[name]
        if name in jobfile.FIELD_NAMES:  # as the one check reads it: a person types that
            value = jobfile.coerce_value(name, value, o.label)
        if o.kind == options.SWITCH:
            argv.append(o.label if value else f"--no-{o.label[2:]}")
        elif o.kind in (options.FLAG, options.OFF):
            argv += [o.label] if value is (o.kind == options.FLAG) else []
        elif o.kind in (options.TABLE, options.SWEEP):
            argv += [
                w for k, v in value.items() for w in (o.label, f"{k}={v if o.kind == options.TABLE else ','.join(v)}")
            ]
        elif o.kind == options.LIST:
            argv += [w for item in value for w in (o.label, item)]
        else:
            argv += [o.label, str(value)]
    return [*argv, "--", "python", "t.py", "--flag"]


def test_every_keyword_and_option_crosses_as_the_job_files_dictionary_and_reads_back_the_same_job():
    """A launch crosses to a login node as one jobfile.Request (the job file's dictionary, JSON), never as a
    command line parsed back: for every option, each of its shapes, given as kit.launch's keyword or on kit
    launch's command line, the login node reads back the job the launch gives here. A sweep value with a comma
    crosses too (spelled as a command line, kit.launch(host=) refused it)."""
    from kit.cli.launch import request_of
    from kit.core import jobfile, keywords, options

    samples = {
        options.INT: [3],
        options.STR: ["x y", "it's"],
        options.LIST: [["a", "b c"], "one"],
        options.TABLE: [{"A": "1", "B": "x=y z"}, ["C=3"]],
        options.SWEEP: [{"lr": [0.1, 0.01]}, ["n=a b,c"]],
        options.SWITCH: [True, False],
        options.FLAG: [True, False],
        options.OFF: [True, False],
    }
    names = handle.python_names()
    checked = 0
    for name, o in names.items():
        if o.kind == options.CHOICE:
            shapes = [True]
        elif name == "job_file" or name in ("mem", "time"):
            shapes = ["10"]
        else:
            shapes = samples[o.kind]
        for value in shapes:
            kwargs = {name: value}
            for here in (keywords.request(["python", "t.py", "--flag"], kwargs), request_of(_spelled(kwargs))):
                there = jobfile.Request.from_json(here.to_json())
                assert there == here, (name, value, here)
                assert there.fields["command"] == ["python", "t.py", "--flag"]
                if name != "job_file":  # (no such file: the spec's check, on either side)
                    assert there.spec() == here.spec(), (name, value, here)
            checked += 1
    assert checked >= len(names) + 30  # every option, most in two shapes
    here = keywords.request(None, {"sweep": {"s": ["a,b", "c"]}})
    spec, _ = jobfile.Request.from_json(here.to_json()).spec()
    assert spec.sweep == {"s": ["a,b", "c"]}
    with pytest.raises(kitlib.KitError, match="the laptop sent"):
        jobfile.Request.from_json('{"fields": [], "dry_run": "yes"}')
    with pytest.raises(kitlib.KitError, match="unknown key 'nodez'"):
        jobfile.Request({"nodez": 2}).spec()


def test_a_result_is_loaded_only_from_a_file_its_rank_wrote_bounded(tmp_path):
    """What kit unpickles (here, or hands to a laptop) is only a regular file of the caller's in the job's own
    results directory, no one else's to write, every rank's, bounded: a link planted at a rank's name (to a
    pickle of the user's own elsewhere), a file others may write, more than a laptop's bound, and an error
    record that is not one are refused."""
    import pickle

    from kit.core.outcome import Outcome
    from kit.job import functions

    job = tmp_path / "job"
    (job / JobDir.RESULTS).mkdir(parents=True)
    job.chmod(0o700)
    ended = Outcome("COMPLETED", 0, "finished")
    for rank, value in enumerate([1, "two"]):
        JobDir(job).result(rank).write_bytes(pickle.dumps(value))
    assert functions.results(job, "7", ended) == [1, "two"]
    elsewhere = tmp_path / "elsewhere.pkl"
    elsewhere.write_bytes(pickle.dumps("planted"))
    second = JobDir(job).result(1)
    second.unlink()
    second.symlink_to(elsewhere)
    with pytest.raises(kitlib.KitError, match="cannot read .*rank-1.pkl: a symlink"):
        functions.results(job, "7", ended)
    second.unlink()
    second.write_bytes(pickle.dumps("two" * 100))
    second.chmod(0o664)
    with pytest.raises(kitlib.KitError, match="not this user's own"):
        functions.results(job, "7", ended)
    second.chmod(0o600)
    with pytest.raises(kitlib.KitError, match=r"rank-1.pkl holds 3\d\d bytes, more than the \d+ kit loads"):
        functions.result_payloads(job, "7", ended, limit=100)
    assert len(b"".join(functions.result_payloads(job, "7", ended, limit=functions.HOSTED_RESULT_LIMIT))) < 400
    JobDir(job).error(1).write_text("[1, 2]")
    with pytest.raises(kitlib.KitError, match="not the record a rank writes"):
        functions.results(job, "7", ended)
