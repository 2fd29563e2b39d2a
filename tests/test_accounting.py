"""The local cluster's accounting: Debian's slurmdbd on a MariaDB of the
cluster's own, so `sacct`, sacct-based efficiency reports and submitit answer as on a site;
its data outlives `down`/`up`; the database listens on no port and only its owner reaches it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import pytest
from helpers import kit, listening, require, state_is, submit, wait_for

from kit import slurm
from kit.cluster import LocalCluster, accounting


@pytest.fixture
def home(tmp_path):
    require("slurmdbd")
    require("mariadbd")
    home = tmp_path / "home"
    yield home
    LocalCluster(home).down(force=True)


def sacct(target, job_id: str) -> list[str]:
    """`sacct -j ID -X`: the job's allocation line (state, elapsed, exit code) as Slurm's database holds it."""
    return target.run(
        ["sacct", "-j", job_id, "-X", "-P", "-n", "--format=JobID,State,Elapsed,ExitCode"], check=False
    ).stdout.split()


def recorded(target, job_id: str, state: str) -> list[str]:
    """Wait for the end record (slurmctld hands it to slurmdbd moments after the job ends)."""
    return wait_for(
        lambda: (line := sacct(target, job_id)) and line[0].split("|")[1] == state and line,
        30,
        what=f"sacct to say {state}",
    )


def cpu_seconds(target, job_id: str) -> float:
    """The allocation's TotalCPU as sacct sums it from the job's step records ([DD-][HH:]MM:SS[.mmm]; with -X,
    which leaves the steps out, it is always 0)."""
    out = target.run(["sacct", "-j", job_id, "-P", "-n", "--format=TotalCPU"], check=False).stdout.split()
    if not out:
        return 0.0
    days, _, clock = out[0].rpartition("-")
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds + 86400 * int(days or 0)


def test_sacct_and_an_efficiency_report_answer_for_kit_jobs(cluster, tmp_path):
    """`sacct -j ID` shows a kit job's state, elapsed time and exit code; reportseff (the
    sacct-based seff of PyPI) reports its CPU efficiency: the CPU time the job's steps used (2 s, whatever the
    machine's load) over the time its CPUs were held."""
    require("reportseff")
    assert cluster.state().dbd_port, "the session cluster runs with accounting when slurmdbd and MariaDB are installed"
    ok = submit(
        tmp_path, "--no-exporter", command=["python3", "-c", "import time\nwhile time.process_time() < 2: pass"]
    )
    bad = submit(tmp_path, "--no-exporter", command=["bash", "-c", "sleep 1; exit 3"])
    for job in (ok, bad):
        slurm.wait(cluster.target, job["job_id"], timeout=120)
    (line,) = recorded(cluster.target, ok["job_id"], "COMPLETED")
    job_id, state, elapsed, code = line.split("|")
    assert (job_id, state, code) == (ok["job_id"], "COMPLETED", "0:0")
    h, m, s = (int(x) for x in elapsed.split(":"))
    wall = h * 3600 + m * 60 + s
    assert 2 <= wall < 60, elapsed
    (line,) = recorded(cluster.target, bad["job_id"], "FAILED")
    assert line.split("|")[3] == "3:0", line
    # reportseff reads TotalCPU in whole seconds: a loop of 3 s on the clock got under 1 s of CPU on a loaded
    # machine, and the report said "---". The loop now spins for 2 s of CPU time, whatever the load.
    cpu = cpu_seconds(cluster.target, ok["job_id"])
    assert cpu >= 2, cpu
    (cpus,) = cluster.target.run(
        ["sacct", "-j", ok["job_id"], "-X", "-P", "-n", "--format=AllocCPUS"], check=False
    ).stdout.split()
    report = subprocess.run(
        ["reportseff", "--no-color", "--format", "JobID,State,Elapsed,CPUEff", ok["job_id"]],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": cluster.target.conf},
    )
    assert report.returncode == 0, report.stderr
    row = report.stdout.splitlines()[-1].split()
    assert row[:2] == [ok["job_id"], "COMPLETED"] and row[3].endswith("%"), report.stdout
    assert float(row[3].rstrip("%")) == round(100 * int(cpu) / int(cpus) / wall, 1), (report.stdout, cpu, cpus, wall)


SUBMITIT = textwrap.dedent("""
    import json, sys, time
    import submitit

    def double(x):
        return 2 * x

    def fail():
        raise ValueError("boom")

    def hang():
        time.sleep(600)

    ex = submitit.AutoExecutor(folder=sys.argv[1])
    ex.update_parameters(timeout_min=10, slurm_partition="local", cpus_per_task=1)
    done, failed, cancelled = ex.submit(double, 21), ex.submit(fail), ex.submit(hang)
    while cancelled.state != "RUNNING":
        time.sleep(0.5)
    cancelled.cancel()
    out = {"result": done.result()}
    try:
        failed.result()
    except Exception as e:
        out["error"] = type(e).__name__ + ": " + str(e)
    for job in (done, failed, cancelled):
        job.wait()
    out["states"] = [job.state for job in (done, failed, cancelled)]
    print(json.dumps(out))
""")


def test_submitit_sees_completed_failed_and_cancelled_jobs_and_its_wait_returns(cluster, tmp_path):
    """Without accounting submitit's wait() hung on a cancelled job (state UNKNOWN)."""
    pytest.importorskip("submitit", reason="submitit is a test dependency: pip install -e .[test]")
    (tmp_path / "use_submitit.py").write_text(SUBMITIT)
    proc = subprocess.run(
        [sys.executable, "use_submitit.py", str(tmp_path / "submitit")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SLURM_CONF": cluster.target.conf},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = __import__("json").loads(proc.stdout.splitlines()[-1])
    assert out["result"] == 42 and out["error"].startswith("FailedJobError") and "boom" in out["error"]
    assert out["states"][:2] == ["COMPLETED", "FAILED"] and out["states"][2].startswith("CANCELLED"), out


@pytest.mark.cluster  # starts a cluster of its own
def test_the_database_survives_down_and_up_and_listens_on_no_port(home):
    env = {"KIT_HOME": str(home)}
    up = kit("cluster", "up", "--nodes", "1", "--cpus-per-node", "1", env=env)
    assert up.returncode == 0 and "with accounting (sacct)" in up.stdout, up.stderr
    c = LocalCluster(home)
    st = c.state()
    out = f"--output={home}/slurm-%j.out"  # not the test's working directory (the checkout)
    proc = c.target.run(["sbatch", "--parsable", out, "--wrap", "sleep 1; exit 5"])
    job_id = proc.stdout.strip().split(";")[0]
    recorded(c.target, job_id, "FAILED")
    before = sacct(c.target, job_id)[0].split("|")[1:]
    assert before[0] == "FAILED" and before[2] == "5:0", before
    # Only this machine, only the cluster's owner: no TCP listener, a socket in a 0700 directory.
    assert listening(st.pids["mariadbd"]) == set()
    d = accounting.directory(home / "cluster")
    assert stat.S_IMODE(d.stat().st_mode) == 0o700 and accounting.db_socket(home / "cluster").is_socket()
    assert stat.S_IMODE((c.public / "slurmdbd.conf").stat().st_mode) == 0o600
    other = subprocess.run(
        [
            "runuser",
            "-u",
            "nobody",
            "--",
            "mariadb",
            f"--socket={accounting.db_socket(home / 'cluster')}",
            "-e",
            "select 1",
        ],
        capture_output=True,
        text=True,
    )
    assert other.returncode != 0 and "(13)" in other.stderr, other.stdout + other.stderr  # EACCES: the directory
    # A job cancelled by `down` is recorded too (its record is handed over before slurmctld stops).
    running = c.target.run(["sbatch", "--parsable", out, "--wrap", "sleep 300"]).stdout.strip().split(";")[0]
    wait_for(state_is(c, running, "RUNNING"), 30, what="the job to run")
    assert kit("cluster", "down", "--force", env=env).returncode == 0
    assert not c.leftover_daemons() and not accounting.db_socket(home / "cluster").exists()
    again = kit("cluster", "up", env=env)
    assert again.returncode == 0, again.stderr
    assert sacct(c.target, job_id)[0].split("|")[1:] == before  # the record as it was, elapsed time and all
    assert sacct(c.target, running)[0].split("|")[1].startswith("CANCELLED")
    # Turned off on request: a running cluster with accounting is not changed under its jobs.
    refused = kit("cluster", "up", "--no-accounting", env=env)
    assert refused.returncode == 2 and "with accounting" in refused.stderr, refused.stderr
    assert kit("cluster", "down", env=env).returncode == 0
    off = kit("cluster", "up", "--no-accounting", env=env)
    assert off.returncode == 0 and "accounting" not in off.stdout and "mariadbd" not in c.state().pids, off.stdout
    assert "accounting_storage/none" in c.conf.read_text()


@pytest.mark.cluster  # starts a cluster of its own
def test_without_the_packages_up_says_so_and_runs_without_accounting(home, monkeypatch):
    """A machine without slurmdbd or MariaDB: `up` says what is missing and how to install it,
    and the cluster runs without accounting; asking for it there is one clean error."""
    monkeypatch.setattr(accounting, "missing", lambda: ["mariadbd", "slurmdbd"])
    heard = []
    st, _ = LocalCluster(home).up(nodes=1, cpus_per_node=1, progress=heard.append)
    assert st.dbd_port is None and "mariadbd" not in st.pids
    assert (
        "no accounting (mariadbd, slurmdbd not installed): sacct and seff will not answer; install Debian's "
        "slurmdbd and MariaDB: apt-get install -y slurmdbd mariadb-server" in heard
    ), heard
    LocalCluster(home).down()
    with pytest.raises(accounting.KitError) as e:
        LocalCluster(home).up(nodes=1, cpus_per_node=1, accounting=True)
    assert (e.value.field, str(e.value)) == ("--accounting", "mariadbd, slurmdbd not found")
