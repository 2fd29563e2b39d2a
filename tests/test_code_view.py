"""A job that writes into its code changes no later job's code. The code
view is a copy of its own (never the store's objects), and at each run's start prelaunch puts
back whatever a run changed, so the next launch, a held job released after it and a requeue of
the same job all run the submitted content."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import kit, read_logs, release_requeued, scontrol, wait_for

import kit as kitlib

# Run 0 prints what it runs, then does to its own code what jobs do by accident (as root here):
# appends to a script, truncates a module, makes a script non-executable, replaces a file by
# rename, removes one; then waits to be requeued (the job given DAMAGE=1). Run 1 prints again and ends.
RUN = """#!/bin/bash
echo "run ${KIT_RESTART}: $(cat lib.txt) $(cat keep.txt) $(ls gone.txt) $(stat -c %a tool.sh)"
if [[ "${KIT_RESTART}" == 0 && -n "${DAMAGE-}" ]]; then
  echo "echo CORRUPTED" >> run.sh
  : > lib.txt
  chmod 0644 tool.sh
  echo replaced > new.tmp && mv -f new.tmp keep.txt
  rm -f gone.txt
  echo damaged
  sleep 600
fi
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.email=t@kit", "-c", "user.name=t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def launch(repo: Path, tmp_path: Path, *extra: str) -> kitlib.Job:
    proc = kit(
        "launch",
        "--local",
        "--no-exporter",
        "--heartbeat",
        "0",
        "--max-restarts",
        "2",
        *extra,
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "bash",
        "run.sh",
        cwd=repo,
    )
    assert proc.returncode == 0, proc.stderr
    return kitlib.Job.from_dir(proc.stdout.split("job dir: ")[1].strip())


def test_a_job_writing_into_its_code_changes_no_later_run(cluster, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "run.sh").write_text(RUN)
    (repo / "lib.txt").write_text("LIB\n")
    (repo / "keep.txt").write_text("KEEP\n")
    (repo / "gone.txt").write_text("x\n")
    (repo / "tool.sh").write_text("#!/bin/sh\n")
    (repo / "tool.sh").chmod(0o755)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "one")
    clean = "LIB KEEP gone.txt 555"

    held = launch(repo, tmp_path, "--sbatch-arg=--hold")
    first = launch(repo, tmp_path, "--env", "DAMAGE=1")
    wait_for(lambda: "damaged" in first.logs(), 120, what="run 0 to change its code")
    assert f"run 0: {clean}" in first.logs()
    assert (first.dir / "code" / "run.sh").read_text() == RUN + "echo CORRUPTED\n"

    # Requeued (held by Slurm until released below): its node is free for the two others.
    scontrol(cluster, "requeue", first.id)
    # A later launch from the untouched tree, and the held job released now, run the submitted code.
    later = launch(repo, tmp_path)
    scontrol(cluster, "release", held.id)
    for job in (later, held):
        assert job.wait(timeout=240).exit_code == 0, read_logs(job.dir)
        out = job.logs()
        assert f"run 0: {clean}" in out and "CORRUPTED" not in out, out
        assert json.loads((job.dir / "job.json").read_text())["snapshot"]["dirty"] is False

    # The same job's next run runs what was submitted, and says what it put back.
    release_requeued(cluster, first.id, first.dir)
    end = first.wait(timeout=240)
    out = first.logs()
    assert end.exit_code == 0 and f"run 1: {clean}" in out and "CORRUPTED" not in out, out + read_logs(first.dir)
    log = read_logs(first.dir)
    assert "code/: put back 5 path(s) changed since the job was submitted" in log, log
    assert (first.dir / "code" / "run.sh").read_text() == RUN and (
        first.dir / "code" / "lib.txt"
    ).read_text() == "LIB\n"


def test_relative_outputs_follow_one_rule_said_at_launch(cluster, tmp_path):
    """A directory the work tree holds but the snapshot leaves out (ignored:
    outputs/) is the work tree's, linked live; a relative path that does not exist at submission
    is created in the job's own code/. kit launch says so when such a directory is there."""
    repo = tmp_path / "repo"
    (repo / "outputs").mkdir(parents=True)
    (repo / ".gitignore").write_text("outputs/\n")
    (repo / "run.sh").write_text("mkdir -p fresh && echo new > fresh/b.txt && echo old > outputs/a.txt\n")
    git(repo, "init", "-q")
    proc = kit(
        "launch",
        "--local",
        "--no-exporter",
        "--wait",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "bash",
        "run.sh",
        cwd=repo,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        f"note: ./outputs are your work tree's, linked live: what the job writes there lands in {repo}" in proc.stderr
    ), proc.stderr
    job_dir = Path(proc.stdout.split("job dir: ")[1].splitlines()[0].strip())
    assert (repo / "outputs" / "a.txt").read_text() == "old\n"  # the existing directory: the work tree's
    assert (job_dir / "code" / "fresh" / "b.txt").read_text() == "new\n" and not (repo / "fresh").exists()
