"""kit from Python (issue 22, done-means 1): kit.launch, kit.Job, kit.jobs on the real local cluster."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from helpers import REPO, kit, wait_for

import kit as kitlib
from kit import api
from kit.cli.launch import launch as launch_command
from kit.jobdir import JobDir


def test_a_plain_python_process_launches_follows_and_waits(cluster, tmp_path):
    """The shipped example, run as a user runs it: a 2-node reference-trainer job from a plain
    Python process; progress seen while it runs; wait() says COMPLETED, exit 0."""
    proc = subprocess.run([sys.executable, str(REPO / "launch" / "examples" / "api_quickstart.py"), "--max-steps",
                           "300", "--output-dir", str(tmp_path / "jobs")], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
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
    flags |= {p.secondary_opts[0] for p in launch_command.params if p.secondary_opts and p.name != "help"} - \
        {"--no-debug", "--no-container-mount-home"}  # the off side of a switch is debug=False
    assert {f.lstrip("-").replace("-", "_") for f in flags} == set(api.python_names())
    bad = [({"nodes": 0}, ["--nodes", "0"]), ({"mem": "lots"}, ["--mem", "lots"]), ({"time": "1:2:3:4"}, ["--time", "1:2:3:4"]),
           ({"env": {"RANK": "3"}}, ["--env", "RANK=3"]), ({"sbatch_arg": ["--nodes=3"]}, ["--sbatch-arg=--nodes=3"]),
           ({"port_range": "9-1"}, ["--port-range", "9-1"]), ({"signal": "KILL"}, ["--signal", "KILL"]),
           ({"mount": ["relative:/x"], "image": str(tmp_path / "none.sqsh")},
            ["--mount", "relative:/x", "--image", str(tmp_path / "none.sqsh")]),
           ({"sweep": ["lr"]}, ["--sweep", "lr"]), ({"after": ["x:maybe"]}, ["--after", "x:maybe"])]
    for keywords, argv in bad:
        with pytest.raises(kitlib.KitError) as e:
            kitlib.launch(["true"], dry_run=True, output_dir=str(tmp_path / "jobs"), **keywords)
        proc = kit("launch", "--dry-run", "--output-dir", str(tmp_path / "jobs"), *argv, "--", "true")
        assert proc.returncode == 2, (argv, proc.stderr)
        assert proc.stderr.splitlines()[0] == f"kit: {e.value.field}: {e.value.message}", (keywords, proc.stderr)
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())
    with pytest.raises(kitlib.KitError, match="unknown option 'nodez'"):
        kitlib.launch(["true"], nodez=2)
    with pytest.raises(kitlib.KitError, match="expected a whole number"):
        kitlib.launch(["true"], nodes="2", dry_run=True)
    job = kitlib.launch("echo $RANK", dry_run=True, output_dir=tmp_path / "ok", nodes=2, env={"A": "1"},
                        no_exporter=True, sweep={"lr": [0.1, 0.01]}, debug=True)
    spec = json.loads((job.dir / JobDir.SPEC).read_text())
    assert job.id is None and spec["command"] == ["bash", "-c", "echo $RANK"] and spec["exporter"] is False
    assert spec["sweep"] == {"lr": ["0.1", "0.01"]} and spec["env"] == {"A": "1"} and spec["debug"] is True
