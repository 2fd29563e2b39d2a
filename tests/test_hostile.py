"""Hostile and broken input: kit writes only what it owns, shared
state cannot be planted or held by another user, bad input is one clear line.

Another user is played by an unnamed uid through ``setpriv`` (the tests run
as root, as CI does).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from helpers import check_end, kit, launch_wait, read_logs, require

from kit import slurm

OTHER_UID = 4242


def as_other(argv: list[str], **kw) -> subprocess.Popen:
    require("setpriv")
    return subprocess.Popen(["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", *argv], **kw)


HOLD = r"""
import fcntl, os, sys, time
held = []
for d in sys.argv[2:]:
    os.makedirs(d, exist_ok=True)
    os.chmod(d, 0o777)  # world-writable, no sticky bit
    for port in range(29500, 29510):
        path = os.path.join(d, str(port))
        if port % 2:
            os.symlink(os.path.join(sys.argv[1], str(port)), path)  # dangling: where a victim file would go
        else:
            f = open(path, "w")
            os.chmod(path, 0o666)
            fcntl.flock(f, fcntl.LOCK_EX)
            held.append(f)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def shared():
    """A directory another user can reach (pytest's own are private to root)."""
    d = Path(tempfile.mkdtemp(prefix="kit-test-shared-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def test_port_locks_planted_or_held_by_another_user_are_not_used(cluster, tmp_path, shared):
    """Another user pre-creates the lock directories (the old
    shared one and this user's own name) with symlinks to a victim path and
    locks held on the rest: the job neither writes through the links nor
    fails for want of a port."""
    shared_tmp = shared / "tmp"
    shared_tmp.mkdir()
    shared_tmp.chmod(0o1777)
    victim = shared / "victim"
    victim.mkdir()
    victim.chmod(0o777)
    planted = [shared_tmp / "kit-ports", shared_tmp / f"kit-ports-{os.geteuid()}"]
    holder = as_other([sys.executable, "-c", HOLD, str(victim), *map(str, planted)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "ready\n"
        w = launch_wait(
            tmp_path,
            "--nodes",
            "2",
            "--port-range",
            "29500-29509",
            command=["bash", "-c", 'echo "port=$MASTER_PORT"'],
            env={"TMPDIR": str(shared_tmp)},
        )
        check_end(cluster, w, state="COMPLETED", code=0, finished=True, log=None, ends=["finished"])
        logs = read_logs(w.job_dir)
        assert re.search(r"port=295\d\d", logs)
        assert list(victim.iterdir()) == []  # nothing created through the planted links
        assert f"warning: {planted[1]} is not a private directory of this user" in logs
        assert all(p.lstat().st_uid == OTHER_UID for d in planted for p in d.iterdir())
    finally:
        holder.kill()
        holder.wait()


def test_port_locks_live_in_a_private_directory(cluster, tmp_path):
    w = launch_wait(tmp_path, command=["bash", "-c", 'echo "port=$MASTER_PORT"'], env={"TMPDIR": str(tmp_path)})
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log=None, ends=["finished"])
    lock_dir = tmp_path / f"kit-ports-{os.geteuid()}"
    st = lock_dir.stat()
    assert (st.st_mode & 0o777, st.st_uid) == (0o700, os.geteuid())
    port = re.search(r"port=(\d+)", read_logs(w.job_dir)).group(1)
    assert (lock_dir / port).is_file()


def _escaped(marker: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and marker in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                pids.append(int(d.name))
        except OSError:
            pass
    return pids


def test_processes_that_leave_the_group_do_not_survive_the_job(cluster, tmp_path):
    """A sidecar and a command that start
    daemons of their own (setsid, so outside the process group kit stops; `env -i`,
    so without the task's token; double-forked, so orphaned) leave nothing."""
    daemons = (
        "setsid sleep 428 </dev/null >/dev/null 2>&1 & "
        "env -i setsid sleep 429 </dev/null >/dev/null 2>&1 & "
        "(env -i setsid sleep 431 </dev/null >/dev/null 2>&1 &) ; sleep 2; echo started"
    )
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--sidecar",
        "setsid sleep 427 & env -i setsid sleep 430 &",
        command=["bash", "-c", daemons],
    )
    names = [f"sleep {n}" for n in (427, 428, 429, 430, 431)]
    try:
        check_end(cluster, w, state="COMPLETED", code=0, finished=True, log="left running", ends=["finished"])
        assert [n for n in names if _escaped(n)] == []
        assert "left below the task" in "".join(p.read_text() for p in w.job_dir.glob("logs/slurm-*.out"))
    finally:
        for n in names:
            for pid in _escaped(n):
                os.kill(pid, 9)


def _exporter(args: list[str], stderr) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kit.monitor", "--no-gpu", "--bind", "127.0.0.1", *args],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        env={**os.environ, "SLURM_JOB_ID": "77"},
    )


def test_exporter_on_a_full_disk_serves_and_removes_its_target(tmp_path, full_disk):
    """Its log and stderr on a full disk (the job directory):
    it serves, and its stop removes the target file it wrote elsewhere."""
    targets = tmp_path / "targets"
    with open(full_disk / "exporter.log", "w") as err:
        proc = _exporter(
            ["--port", "19701-19710", "--targets-dir", str(targets), "--log", str(full_disk / "metrics.jsonl")], err
        )
    try:
        deadline = time.monotonic() + 30
        while not list(targets.glob("kit-77-*.json")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2)  # a few polls, each failing to log
        assert proc.poll() is None, "the exporter died on the full disk"
        (target,) = targets.glob("kit-77-*.json")
        proc.terminate()
        assert proc.wait(10) == 0
        assert list(targets.iterdir()) == []
    finally:
        proc.kill()


def test_exporter_replaces_planted_symlinks_in_a_shared_targets_directory(tmp_path):
    """Another user plants its target's name (predictable: job, node,
    port) as a symlink to a file of root's in a shared targets directory. The exporter
    replaces the name; the file it pointed to is untouched."""
    targets = tmp_path / "targets"
    targets.mkdir(mode=0o777)
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    for port in (19721, 19722):
        (targets / f"kit-77-n1-{port}.json").symlink_to(victim)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kit.monitor",
            "--no-gpu",
            "--bind",
            "127.0.0.1",
            "--port",
            "19721-19722",
            "--targets-dir",
            str(targets),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "n1"},
    )
    try:
        deadline = time.monotonic() + 30
        while not [p for p in targets.iterdir() if not p.is_symlink()] and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        (written,) = [p for p in targets.iterdir() if not p.is_symlink()]
        assert '"targets"' in written.read_text() and victim.read_text() == "root's file\n"
    finally:
        proc.terminate()
        proc.wait(10)
    assert victim.read_text() == "root's file\n"
    assert not [p.name for p in targets.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_exporter_that_cannot_write_its_target_gives_up_cleanly(tmp_path, full_disk):
    targets = full_disk / "targets"
    proc = _exporter(["--port", "19711-19720", "--targets-dir", str(targets)], subprocess.PIPE)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert err.decode().startswith("kit exporter: cannot advertise to Prometheus: [Errno 28] No space left on device")
    assert list(targets.iterdir()) == []


@pytest.fixture
def tiny_image(tmp_path) -> Path:
    """A squashfs with bash and tee (all the launcher needs to be accepted)."""
    root = tmp_path / "img-root" / "bin"
    root.mkdir(parents=True)
    for tool in ("bash", "tee"):
        shutil.copy2(shutil.which(tool), root / tool)
    image = tmp_path / "tiny.sqsh"
    subprocess.run(
        ["mksquashfs", str(root.parent), str(image), "-quiet", "-noappend"], check=True, stdout=subprocess.DEVNULL
    )
    return image


@pytest.fixture
def ro_dir(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(d)], check=True)
    yield d
    subprocess.run(["umount", "-l", str(d)], check=True)


def _one_clear_line(proc, code: int, first: str) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[0].startswith(first), proc.stderr


def test_unwritable_output_directories_are_one_line(tmp_path, full_disk, ro_dir):
    for where, why in ((full_disk, "No space left on device"), (ro_dir, "Read-only file system")):
        proc = kit("launch", "--dry-run", "--output-dir", str(where), "--", "echo", cwd=tmp_path)
        _one_clear_line(proc, 1, f"kit: --output-dir: cannot write the job directory {where}/kit-")
        assert proc.stderr.splitlines()[0].endswith(why)
        assert [p.name for p in where.iterdir()] in (["targets", "filler"], ["filler", "targets"], [])
    proc = kit("build", "x.toml", "-o", "/proc/x.sqsh", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_bad_images_and_mounts_are_one_line(tmp_path, tiny_image):
    truncated = tmp_path / "truncated.sqsh"
    truncated.write_bytes(tiny_image.read_bytes()[:20000])
    out = ["--dry-run", "--output-dir", str(tmp_path / "jobs")]
    proc = kit("launch", *out, "--image", str(truncated), "--", "echo")
    _one_clear_line(proc, 2, f"kit: --image: cannot read {truncated}: truncated or damaged")
    proc = kit("launch", *out, "--image", str(tiny_image), "--mount", f"{tmp_path}:/", "--", "echo")
    _one_clear_line(proc, 2, "kit: --mount: a mount over the container's root is not possible")
    for dst in (str(tmp_path), str(tmp_path / "jobs"), "/opt/kit"):
        proc = kit("launch", *out, "--image", str(tiny_image), "--mount", f"{tmp_path}:{dst}", "--", "echo")
        _one_clear_line(proc, 2, f"kit: --mount: {tmp_path}:{dst} would cover ")
    assert not (tmp_path / "jobs").exists()


def test_a_targets_directory_that_cannot_be_made_is_one_line(cluster, tmp_path, tiny_image):
    proc = kit(
        "launch",
        "--local",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--image",
        str(tiny_image),
        "--prometheus-targets",
        "/etc/passwd/x",
        "--",
        "echo",
        cwd=tmp_path,
    )
    _one_clear_line(proc, 2, "kit: --prometheus-targets: cannot create /etc/passwd/x: Not a directory")
    assert list((tmp_path / "jobs").iterdir()) == []  # the job directory went with it; nothing submitted


def test_a_disk_that_fills_after_sbatch_still_names_the_submitted_job(cluster, tmp_path):
    """The job directory's disk fills between sbatch and kit's
    record of the job id. kit says the job was submitted, with its id (exit 1), and
    does not pretend nothing happened."""
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    job_id = None
    try:
        bindir = tmp_path / "bin"
        bindir.mkdir()
        (bindir / "sbatch").write_text(
            "#!/bin/bash\n"
            f'out="$({shutil.which("sbatch")} "$@")" || exit $?\n'
            # the disk fills just after Slurm took the job
            f"dd if=/dev/zero of={small}/filler bs=4k 2>/dev/null\n"
            'printf "%s\\n" "$out"\n'
        )
        (bindir / "sbatch").chmod(0o755)
        proc = kit(
            "launch",
            "--local",
            "--output-dir",
            str(small),
            "--",
            "sleep",
            "600",
            cwd=tmp_path,
            env={"PATH": f"{bindir}:{os.environ['PATH']}"},
        )
        m = re.search(
            r"^kit: job (\d+) was submitted and runs, but its record in \S+ could not be written: "
            r"No space left on device$",
            proc.stderr,
            re.M,
        )
        assert proc.returncode == 1 and m, proc.stderr
        assert "Traceback" not in proc.stderr
        job_id = m.group(1)
        assert slurm.job_status(cluster.target, job_id).state in ("PENDING", "RUNNING")
    finally:
        if job_id:
            slurm.cancel(cluster.target, job_id)
            slurm.wait(cluster.target, job_id, timeout=90)
        subprocess.run(["umount", "-l", str(small)], check=True)


PICK = """
KIT_PORT_LOW=29600 KIT_PORT_HIGH=29609 KIT_RESTART=0 SLURM_JOB_ID=1 KIT_PORT_LOCK_FD= KIT_PORT_CLAIM_PID=
SLURM_WORKING_CLUSTER=kit:127.0.0.1:6817:9728:109 SLURM_CONF=/run/kit/cluster-x/slurm.conf
kit::pick_port
echo "$MASTER_PORT"
exec >&-
sleep 60
"""


def test_job_one_of_two_clusters_never_shares_a_rendezvous_port(tmp_path):
    """Every local cluster numbers its jobs from 1, and the scan for MASTER_PORT started from the job id: job 1 of
    two clusters on one machine, picked for two users (each with a lock directory of their own), took the same
    port while neither rank had bound it yet (10-40 s under real pyxis's create mode): a rank joined the other
    cluster's rendezvous. The port is claimed machine-wide until the step ends: the second pick, made while the
    first still holds its unbound port, takes another; the claim's holder goes with the shell that made it."""
    from test_bash_rules import LAUNCH, bash_functions

    fns = (LAUNCH / "lib.sh").read_text() + bash_functions(
        "kit::_port_free", "kit::_release_port", "kit::_port_lock_dir", "kit::pick_port"
    )
    picks = []
    for user in ("first", "second"):  # the same seed (job, cluster, uid) on purpose: only the claim keeps them apart
        private = tmp_path / user
        private.mkdir()
        picks.append(
            subprocess.Popen(
                ["bash", "-c", "set -euo pipefail\n" + fns + PICK],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={"PATH": "/usr/bin:/bin", "TMPDIR": str(private)},
                start_new_session=True,
            )
        )
        picks[-1].port = picks[-1].stdout.readline().strip()
    try:
        assert all(p.port.isdigit() for p in picks), [p.port for p in picks]
        assert picks[0].port != picks[1].port, [p.port for p in picks]
        # Each shell's claim holder, by its pid: /proc/net/unix is every process's (a job of a cluster beside this
        # test may claim the same port once it is given back, as one did in CI).
        holders = [c for p in picks for c in psutil.Process(p.pid).children() if c.name().startswith("python")]
        assert len(holders) == 2, holders
        for p in picks:
            os.kill(p.pid, 9)  # the shell alone (a prelaunch killed): its claim's holder notices and ends
            p.wait()
        _, alive = psutil.wait_procs(holders, timeout=10)
        assert not alive, f"a claim outlived the shell that made it: {alive}"
    finally:
        for p in picks:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)  # its sleep
            p.wait()
