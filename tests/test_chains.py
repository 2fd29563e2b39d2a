"""Chains of stages with --after, on the real local cluster."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import check_end, kit, launch_wait, read_logs, runs, submit

from kit.core import outcome


def test_stage_two_runs_only_after_stage_one_succeeded(cluster, tmp_path):
    first = submit(tmp_path, command=["bash", "-c", "sleep 3; echo stage one"])
    w = launch_wait(tmp_path, "--after", first["job_dir"], command=["bash", "-c", "echo stage two"])
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log="stage two", ends=["finished"])
    one, two = runs(Path(first["job_dir"]))[0], runs(w.job_dir)[0]
    assert one["end"] == "finished" and two["time"] >= one["time"]
    sbatch = json.loads((w.job_dir / "sbatch.json").read_text())
    assert f"--dependency=afterok:{first['job_id']}" in sbatch and "--kill-on-invalid-dep=yes" in sbatch


def test_a_failed_stage_one_means_stage_two_never_runs_and_wait_says_why(cluster, tmp_path):
    first = submit(tmp_path, command=["bash", "-c", "sleep 2; exit 4"])
    w = launch_wait(tmp_path, "--after", first["job_id"], command=["bash", "-c", "echo stage two ran"])
    rc, err = w.finish()
    assert rc == outcome.CANCELLED, err
    assert (
        f"kit: job {w.job_id} ended CANCELLED: it never ran: its dependency can never be met "
        f"(afterok:{first['job_id']}(failed))"
    ) in err
    assert "stage two ran" not in read_logs(w.job_dir) and runs(w.job_dir) == []
    # Now that it failed, a new stage after it is refused before submitting; :any is accepted.
    late = kit(
        "launch",
        "--local",
        "--dry-run",
        "--output-dir",
        str(tmp_path / "late"),
        "--after",
        first["job_id"],
        "--",
        "true",
    )
    assert late.returncode == 0  # a dry run does not ask Slurm
    refused = kit("launch", "--local", "--output-dir", str(tmp_path / "late"), "--after", first["job_id"], "--", "true")
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[0] == (
        f"kit: --after: job {first['job_id']} already ended FAILED: a job after it succeeded would never run"
    )


def test_an_unknown_job_is_refused_before_submitting(cluster, tmp_path):
    for ref, first in (
        ("99999", "kit: --after: job 99999 is unknown to Slurm"),
        (
            str(tmp_path / "nope"),
            f"kit: --after: '{tmp_path / 'nope'}' is neither a job id nor a submitted kit job directory",
        ),
        ("12:maybe", "kit: --after: '12:maybe' is neither a job id"),
    ):
        proc = kit("launch", "--local", "--output-dir", str(tmp_path / "jobs"), "--after", ref, "--", "true")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.splitlines()[0].startswith(first), proc.stderr
    assert not (tmp_path / "jobs").exists() or list((tmp_path / "jobs").iterdir()) == []
    proc = kit("launch", "--dry-run", "--sbatch-arg=--dependency=afterok:1", "--", "true")
    assert proc.returncode == 2 and proc.stderr.startswith("kit: --sbatch-arg: --dependency is set by kit")
