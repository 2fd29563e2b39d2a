"""Container jobs on the local cluster: the
shipped CPU recipe built on a locally made Debian base, run as a 2-node
Lightning DDP job through the pyxis flags kit puts on the srun step."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import (REPO, Waiting, assert_nothing_left, container_mode, kit, named_containers, read_logs, submit,
                     wait_for, wait_no_processes)

from kit import slurm


@pytest.fixture(scope="module")
def small_image(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("small")
    (d / "root" / "usr" / "bin").mkdir(parents=True)
    out = d / "small.sqsh"
    subprocess.run(["mksquashfs", str(d / "root"), str(out), "-quiet", "-no-progress"], check=True)
    return out


def released(cluster, before: tuple[list[str], list[str]], timeout: float = 30) -> bool:
    """True once the cluster's loop devices and mounts are as ``before``: srun returns when the tasks
    end, and slurmstepd takes the container down just after (its mount namespace)."""
    wait_for(lambda: loops_and_mounts(cluster) == before, timeout, poll=0.2,
             what="the container's loop device and mounts to go")
    return True


def loops_and_mounts(cluster) -> tuple[list[str], list[str]]:
    """The loop devices of this cluster's images (their files under its KIT_HOME) and the mounts of them or
    of its directories: another cluster on the machine (CI may run one beside) has its own."""
    home = str(cluster.home)
    loops = [line for line in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout.splitlines()
             if home in line]
    devices = {line.split(":")[0] for line in loops}
    mounts = [line for line in Path("/proc/mounts").read_text().splitlines()
              if line.split()[0] in devices or ("kit-pyxis" in line and home in line)]
    return loops, mounts


@contextlib.contextmanager
def container_scope(cluster, scope: str):
    """The session's cluster under pyxis's ``container_scope`` (each new step and job epilog reads it)."""
    before = cluster.state().container_scope
    cluster.up(container_scope=scope)
    try:
        yield
    finally:
        cluster.up(container_scope=before)


def fuse_daemons(cluster) -> list[str]:
    """squashfuse (and fuse-overlayfs, where enroot has no native overlay) processes of this cluster's
    jobs (their image or mount point under its KIT_HOME): the runtime's, under squashfuse mode."""
    out = subprocess.run(["pgrep", "-a", "-x", "squashfuse|fuse-overlayfs"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(cluster.home) in line]


@pytest.mark.parametrize("mode", ["create", "squashfuse"])
def test_two_node_lightning_job_runs_inside_the_image(cluster, cpu_image, tmp_path, mode):
    """The README's main job in each of pyxis's modes. In squashfuse mode
    the node's first task has the runtime's FUSE daemons below it for the whole step: the
    job ends COMPLETED 0 (a teardown that stopped them failed it with the root gone:
    "Transport endpoint is not connected"), and nothing of them is left after it."""
    with container_mode(cluster, mode):
        two_node_lightning_job(cluster, cpu_image, tmp_path, mode)


def two_node_lightning_job(cluster, cpu_image, tmp_path, mode):
    assert cluster.state().containers in ("kit-pyxis", "pyxis")
    assert fuse_daemons(cluster) == []
    slurmd_log = cluster.root / "log" / "slurmd-node1.log"
    slurmd_log_at = slurmd_log.stat().st_size
    host = tmp_path / "host-data"
    host.mkdir()
    (host / "from-host.txt").write_text("host file\n")
    loops_before, mounts_before = loops_and_mounts(cluster)
    probe = ('echo "rank=$RANK marker=$(cat /.kit/image.json | head -c 1) pwd=$(pwd) '
             'pu=$PYTHONUNBUFFERED ma=$MASTER_ADDR mp=$MASTER_PORT host=$(cat /data/from-host.txt)" '
             '> "/data/probe-$RANK.txt"; '
             # --step-delay: the training spans several exporter polls, so the report has a throughput to draw
             'exec python3 -m kit.train --max-steps 30 --step-delay 0.1 --checkpoint-every 10 --checkpoint-dir /data/ckpt')
    proc = kit("launch", "--local", "--nodes", "2", "--wait", "--image", str(cpu_image),
               "--mount", f"{host}:/data", "--env", "PYTHONUNBUFFERED=from-the-job",
               "--output-dir", str(tmp_path / "jobs"), "--", "bash", "-c", probe, cwd=tmp_path, timeout=600)
    job_dir = re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1)
    assert proc.returncode == 0, proc.stderr + read_logs(job_dir)
    assert not Path("/.kit/image.json").exists()  # the marker exists only in the image
    for rank in (0, 1):
        line = (host / f"probe-{rank}.txt").read_text()
        assert f"rank={rank} marker={{" in line          # /.kit/image.json was readable: inside the image
        assert "pwd=/workspace " in line                   # the image's workdir
        assert "pu=from-the-job " in line                  # the job's value beat the image's ENV (=1)
        assert re.search(r"ma=\S+ mp=\d+ host=host file", line)
    logs = read_logs(job_dir)
    assert re.search(r"rank=0 world_size=2", logs) and re.search(r"rank=1 world_size=2", logs)
    assert "done at step=30" in logs
    assert (host / "ckpt" / "last.ckpt").stat().st_size > 0  # written through the mount
    assert wait_no_processes(job_dir, 5) == []
    assert released(cluster, (loops_before, mounts_before))
    # kit report on this, the README's main job: the exporter in the
    # container saw the job's processes; panels for what was measured, numbers from the logs.
    from report_check import check

    rep = kit("report", job_dir, "--prometheus", "http://127.0.0.1:1")
    assert rep.returncode == 0, rep.stderr
    summary = json.loads((Path(job_dir) / "report.json").read_text())
    assert summary["panels"] == ["CPU (cores busy)", "Memory (GiB)", "Training loss", "Step time (s)",
                                 "Model TFLOP/s per device", "Training throughput (samples/s)"], summary["panels"]
    assert summary["tflops"] > 0 and summary["mfu"] is None  # measured in the image; on CPUs no MFU
    want = check(Path(job_dir), summary, rep.stdout)
    assert all(n["cpu_cores_used"] > 0 and n["memory_peak_bytes"] > 50 * 2 ** 20 for n in want["nodes"].values())
    # The container's start, per node and run, in report.json, the text and kit ps.
    starts = summary["task_starts"]
    assert sorted(t["node"] for t in starts) == ["node1", "node2"] and {t["run"] for t in starts} == {0}, starts
    assert all(0 < t["seconds"] < 300 for t in starts), starts
    assert "task start after srun (with an image: the container's start): run 0: node1 " in rep.stdout, rep.stdout
    rows = json.loads(kit("ps", "--json", "--all", "--output-dir", str(tmp_path / "jobs")).stdout)
    (row,) = [r for r in rows if r["job_dir"] == str(Path(job_dir).resolve())]
    assert sorted(row["task_start"]) == ["node1", "node2"], row
    # Which mode each node ran, from the task itself (its root's file system), in report.json
    # and the text; the status says the cluster's; pyxis's own words in the slurmd log.
    assert [t["mode"] for t in starts] == [mode, mode], starts
    assert f"container: {mode} mode (" in rep.stdout and "on node1, node2" in rep.stdout, rep.stdout
    status = kit("cluster", "status").stdout
    assert f"; {mode} mode (" in status, status
    with open(slurmd_log, errors="replace") as f:
        f.seek(slurmd_log_at)
        skipped = "skipping container creation (squashfuse enabled)" in f.read()
    assert skipped == (mode == "squashfuse")
    assert "Transport endpoint is not connected" not in logs
    wait_for(lambda: fuse_daemons(cluster) == [], 30, what="the step's FUSE daemons to end with it")


def image_listing(image: Path) -> list[str]:
    """``unsquashfs -lls`` rows, but for kit's own provenance file (it names the recipe)."""
    out = subprocess.run(["unsquashfs", "-lls", str(image)], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.startswith(("d", "-", "l", "c", "b", "p", "s"))
            and not line.endswith("squashfs-root/.kit/image.json")]


def test_the_dockerfile_builds_the_same_image_as_the_toml_recipe(cluster, cpu_image, tmp_path):
    """containers/cpu-lightning.Dockerfile and .toml give the same file
    tree and enroot metadata (the Dockerfile's build finds the TOML build's layers in the
    cache: same steps, same keys), and the README's main job runs in the Dockerfile's image."""
    from kit.image.builder import cache_dir

    # A whole image left in the image cache by an earlier session on the same KIT_HOME
    # (KIT_TEST_CLUSTER) would be taken as it is, and no step would be looked up.
    for cached in cache_dir().glob("*.sqsh"):
        cached.unlink()
    out = tmp_path / "from-dockerfile.sqsh"
    proc = kit("build", str(REPO / "containers"), "-f", "cpu-lightning.Dockerfile", "-o", str(out), timeout=1200)
    assert proc.returncode == 0, proc.stderr
    assert "cached: pip: " in proc.stderr and "cached: kit: " in proc.stderr, proc.stderr
    assert image_listing(out) == image_listing(cpu_image)
    for name in ("etc/environment", "etc/rc", "etc/fstab"):
        read = [subprocess.run(["unsquashfs", "-cat", str(i), name], capture_output=True, text=True).stdout
                for i in (out, cpu_image)]
        assert read[0] == read[1], name
    job = kit("launch", "--local", "--nodes", "2", "--wait", "--image", str(out), "--output-dir", str(tmp_path / "jobs"),
              "--", "python3", "-m", "kit.train", "--max-steps", "20", cwd=tmp_path, timeout=600)
    job_dir = re.search(r"^job dir: (.+)$", job.stdout, re.M).group(1)
    assert job.returncode == 0, job.stderr + read_logs(job_dir)
    assert "done at step=20" in read_logs(job_dir)


def test_console_scripts_are_on_path_and_torchrun_forms_one_world_in_the_image(cluster, cpu_image, tmp_path):
    """Every console script the image's pip step installed runs (none
    exits 126 or 127: on PATH, its #! naming the image's python), and the README's torchrun
    example with --image, as written there, forms one world of 4 on 2 nodes."""
    listing = subprocess.run(["unsquashfs", "-lc", str(cpu_image), "usr/local/bin"], capture_output=True,
                             text=True).stdout
    scripts = sorted(line.rsplit("/", 1)[1] for line in listing.splitlines() if "/usr/local/bin/" in line)
    assert {"torchrun", "fabric", "tqdm"} <= set(scripts), listing
    probe = ('for s in /usr/local/bin/*; do timeout 120 "$s" --help </dev/null >/dev/null 2>&1; '
             'echo "script $(basename "$s") $? $(head -c 60 "$s" | head -n 1)"; done')
    proc = kit("launch", "--local", "--wait", "--image", str(cpu_image), "--output-dir", str(tmp_path / "jobs"),
               "--", "bash", "-c", probe, cwd=tmp_path, timeout=900)
    job_dir = re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1)
    assert proc.returncode == 0, proc.stderr + read_logs(job_dir)
    ran = {m.group(1): (int(m.group(2)), m.group(3)) for m in
           re.finditer(r"script (\S+) (\d+) (.*)$", read_logs(job_dir), re.M)}
    assert sorted(ran) == scripts
    assert [name for name, (code, _) in ran.items() if code in (126, 127)] == [], ran
    assert all(line == "#!/usr/bin/python3" for _, line in ran.values() if line.startswith("#!")), ran
    # The README's example (launch/examples reaches the container through --mount).
    readme = (REPO / "README.md").read_text()
    line = next(ln.strip() for ln in readme.splitlines() if "--image" in ln and "torchrun --nproc-per-node 2" in ln)
    args = shlex.split(line.replace("$PWD", str(REPO)).replace("cpu-lightning.sqsh", str(cpu_image)))
    assert args[:2] == ["kit", "launch"], line
    proc = kit("launch", "--local", "--wait", "--output-dir", str(tmp_path / "jobs"), *args[2:], cwd=REPO,
               timeout=900)
    job_dir = re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1)
    assert proc.returncode == 0, proc.stderr + read_logs(job_dir)
    logs = read_logs(job_dir)
    assert "world=4" in logs and "fsdp2 done" in logs, logs


def test_an_image_without_bash_is_refused_before_submitting(small_image, tmp_path):
    proc = kit("launch", "--dry-run", "--image", str(small_image), "--output-dir", str(tmp_path / "jobs"),
               "--", "true")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == (
        f"kit: --image: {small_image} has no bash or tee, which launcher.sh needs inside the container")
    assert not (tmp_path / "jobs").exists()


def test_container_workdir_must_exist(cluster, cpu_image, tmp_path):
    proc = kit("launch", "--local", "--wait", "--image", str(cpu_image), "--container-workdir", "/not/there",
               "--output-dir", str(tmp_path / "jobs"), "--", "true", cwd=tmp_path, timeout=120)
    job_dir = re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1)
    assert proc.returncode != 0
    # PYXIS.md: the task fails with pyxis's "couldn't chdir to /not/there: No such file or
    # directory" (the stand-in says it with its own tag): the words both plugins share.
    assert re.search(r"(pyxis|kit-pyxis): couldn't chdir to /not/there: No such file or directory",
                     read_logs(job_dir)), read_logs(job_dir)
    # No rank started: kit logs and --errors show the batch log's story.
    logs = kit("logs", job_dir)
    assert logs.returncode == 0 and "couldn't chdir to /not/there" in logs.stdout, logs.stdout + logs.stderr
    assert logs.stderr.startswith("kit: no rank of run 0 has a log")
    errors = kit("logs", job_dir, "--errors")
    assert errors.stdout.startswith("run 0 failed (exit code ") and "couldn't chdir to /not/there" in errors.stdout, \
        errors.stdout


def test_environment_and_mount_flags_follow_pyxis(cluster, cpu_image, tmp_path):
    """PYXIS.md, "Inside the container": the task loses LANG, LANGUAGE and LC_ALL; the
    login variables (USER, LOGNAME, HOME as root) and the image's /etc/environment win
    over the task's values except names in --container-env (kit adds --env names);
    every accepted mount flag is honoured (ro+nosuid+noexec here)."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "tool.sh").write_text("#!/bin/sh\necho ran\n")
    (host / "tool.sh").chmod(0o755)
    probe = ('echo "lang=${LANG-unset} language=${LANGUAGE-unset} lc_all=${LC_ALL-unset} user=$USER '
             'logname=${LOGNAME-unset} home=$HOME"; '
             'grep " /data " /proc/self/mountinfo | cut -d" " -f6; '
             '/data/tool.sh || echo "exec refused"; touch /data/x 2>/dev/null || echo "write refused"')
    env = {**os.environ, "LANG": "en_US.UTF-8", "LANGUAGE": "en", "HOME": str(tmp_path), "USER": "alice",
           "LOGNAME": "alice"}
    proc = subprocess.run([sys.executable, "-m", "kit", "launch", "--local", "--wait", "--image", str(cpu_image),
                           "--env", "LC_ALL=C", "--mount", f"{host}:/data:ro+nosuid+noexec",
                           "--output-dir", str(tmp_path / "jobs"), "--", "bash", "-c", probe],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    job_dir = re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1)
    assert proc.returncode == 0, proc.stderr + read_logs(job_dir)
    out = (Path(job_dir) / "logs" / "rank-0.r0.log").read_text().splitlines()
    # LANGUAGE is removed; LANG is the image's (its ENV), not the task's; LC_ALL came with --env,
    # so kit lists it in --container-env: it is kept.
    assert out[0] == "lang=C.UTF-8 language=unset lc_all=C user=root logname=root home=/root", out
    assert set(out[1].split(",")) >= {"ro", "nosuid", "noexec"}, out
    assert "exec refused" in out and "write refused" in out and "ran" not in out, out


BAD_LAUNCH = [
    (["--mount", "relative/data:/data"], "kit: --mount: mount source must be an absolute path: 'relative/data'"),
    (["--mount", "/nonexistent/data:/data"], "kit: --mount: source does not exist: /nonexistent/data"),
    (["--mount", "/tmp/a,b:/data"], "kit: --mount: mount source contains a comma: '/tmp/a,b'"),
    (["--mount", "/tmp:/data:ro+bogus"], "kit: --mount: unknown mount flag 'bogus' in '/tmp:/data:ro+bogus'"),
    (["--mount", "/tmp:data"], "kit: --mount: mount destination must be an absolute path: 'data'"),
    (["--container-workdir", "rel"], "kit: --container-workdir: must be an absolute path, got 'rel'"),
]


@pytest.mark.parametrize("args,message", BAD_LAUNCH, ids=[" ".join(a) for a, _ in BAD_LAUNCH])
def test_bad_container_input(small_image, tmp_path, args, message):
    proc = kit("launch", "--dry-run", "--image", str(small_image), "--output-dir", str(tmp_path / "jobs"), *args,
               "--", "true")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == message
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "jobs").exists()


def test_image_must_be_squashfs(tmp_path):
    not_sqsh = tmp_path / "image.sqsh"
    not_sqsh.write_text("not an image")
    proc = kit("launch", "--dry-run", "--image", str(not_sqsh), "--output-dir", str(tmp_path / "jobs"), "--", "true")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == f"kit: --image: not a squashfs image: {not_sqsh}"
    assert not (tmp_path / "jobs").exists()


def test_container_flags_in_the_dry_run(cpu_image, tmp_path):
    proc = kit("launch", "--dry-run", "--json", "--image", str(cpu_image), "--mount", "/tmp:/scratch:ro",
               "--mount", "tmpfs:/fast", "--container-env", "MY_VAR", "--env", "OTHER=1",
               "--output-dir", str(tmp_path / "jobs"), "--", "python", "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    job_dir = out["job_dir"]
    assert not any(a.startswith("--container") for a in out["sbatch_argv"])
    srun = out["srun_argv"]
    mounts = [a for a in srun if a.startswith("--container-mounts=")]
    assert mounts == [f"--container-mounts={job_dir}:{job_dir},/tmp:/scratch:ro,tmpfs:/fast"]
    # A dry run hashes the image file, copies nothing: the flags name the file given.
    spec = json.loads((Path(job_dir) / "job.json").read_text())
    assert spec["image_source"] == str(cpu_image) and spec["image_digest"].startswith("sha256:")
    assert spec["image"] == str(cpu_image)
    assert f"--container-image={spec['image']}" in srun and "--container-workdir=/workspace" in srun
    env = [a for a in srun if a.startswith("--container-env=")][0].split("=", 1)[1].split(",")
    assert {"MASTER_ADDR", "MASTER_PORT", "KIT_JOB_DIR", "MY_VAR", "OTHER", "DEBUG"} <= set(env)
    assert srun[-1] == f"{job_dir}/launcher.sh"
    # From a git work tree the command starts in the code snapshot's view, in the container too, with
    # the tree mounted at its own path (what the snapshot leaves out is linked there).
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "train.py").write_text("print('train')\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    proc = kit("launch", "--dry-run", "--json", "--image", str(cpu_image), "--output-dir", str(tmp_path / "jobs"),
               "--", "python", "train.py", cwd=repo / "src")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    job_dir, srun = out["job_dir"], out["srun_argv"]
    assert [a for a in srun if a.startswith("--container-mounts=")] == [
        f"--container-mounts={repo}:{repo},{job_dir}:{job_dir}"]
    assert f"--container-workdir={job_dir}/code/src" in srun and f"--chdir={job_dir}/code/src" in out["sbatch_argv"]


@pytest.mark.parametrize("mode", ["create", "squashfuse"])
def test_a_failed_and_a_cancelled_two_node_container_job_leave_nothing(cluster, cpu_image, tmp_path, mode):
    """No process, mount, loop device or container filesystem after a failure and after
    scancel (success: the main job's test), in each of pyxis's modes. The failing rank's own
    code is its task's: the launcher's teardown (in its EXIT trap, after the failed command)
    leaves the runtime's FUSE daemons alone — it once stopped them, and the task died 126
    of its root gone ("Transport endpoint is not connected")."""
    with container_mode(cluster, mode):
        failed_and_cancelled(cluster, cpu_image, tmp_path)
    assert fuse_daemons(cluster) == []


STOPPING = """
import os, signal, sys, time
rank = os.environ["RANK"]
def stuck(sig, frame):
    print(f"rank {rank}: SIGTERM, not stopping (a rank waiting on a peer that is gone)", flush=True)
def handler(sig, frame):
    time.sleep(1.5)  # the step's signal reached every process of the step by now
    try:
        open("/dev/null").close()
        seen = "ok"
    except OSError as e:
        seen = e.strerror
    print(f"rank {rank}: handler: /dev/null: {seen}", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stuck if rank == "0" else handler)
print(f"ready-{rank}", flush=True)
while True:
    time.sleep(0.1)
"""


@contextlib.contextmanager
def stand_in_setting(cluster, setting: str):
    """One more setting on the stand-in's plugstack.conf line (each new step reads it); then the file as it was."""
    if cluster.state().containers != "kit-pyxis":
        pytest.skip(f"{setting} is a setting of kit's stand-in; on real pyxis the site's enroot.conf decides")
    conf = cluster.public / "plugstack.conf"
    before = conf.read_text()
    conf.write_text("".join(f"{line} {setting}\n" if line.startswith("required ") else f"{line}\n"
                            for line in before.splitlines()))
    try:
        yield
    finally:
        conf.write_text(before)


# What rank 1's handler finds at /dev/null 1.5 s after the step's signal, in each mode: the image's root is gone
# under squashfuse mode — through enroot's default kernel overlay a path whose dentries pointed into squashfuse
# is stale (real pyxis 0.24 + enroot 4.1.2 here: the same), through fuse-overlayfs (ENROOT_NATIVE_OVERLAYFS=no,
# the stand-in's native_overlayfs=0) every path from "/" fails.
SEEN = {"create": "ok", "squashfuse": "Stale file handle",
        "squashfuse-fuse-overlayfs": "Transport endpoint is not connected"}


@pytest.mark.parametrize("mode", list(SEEN))
def test_a_cancelled_container_step_ends_in_seconds_with_every_rank_recorded(cluster, cpu_image, tmp_path, mode):
    """PYXIS.md, squashfuse mode: the step's SIGTERM also reaches the runtime's FUSE daemons, and paths
    through the image's root fail from then on (/dev/null, /proc, the job directory's mount point). The job
    directory is where users keep it, under the image's root (not the container's /tmp tmpfs). Rank 0
    ignores SIGTERM (a rank waiting on a peer that is gone): its launcher kills it after --stop-grace (3 s)
    all the same; rank 1's handler finds the image gone and exits; each launcher records how its rank
    ended, and the cancel ends in seconds, not at KillWait (30 s). Before the launcher kept its descriptors
    and read /proc from its working directory, under fuse-overlayfs: 32.6 s, both exit records empty
    ("cannot redirect standard input from /dev/null": its killer never ran)."""
    out = Path(tempfile.mkdtemp(prefix="kit-test-", dir="/var/tmp"))
    overlay = stand_in_setting(cluster, "native_overlayfs=0") if mode.endswith("fuse-overlayfs") else \
        contextlib.nullcontext()
    try:
        with container_mode(cluster, mode.split("-")[0]), overlay:
            proc = kit("launch", "--local", "--json", "--nodes", "2", "--image", str(cpu_image), "--output-dir",
                       str(out), "--", "python3", "-c", STOPPING, cwd=tmp_path)
            assert proc.returncode == 0, proc.stderr
            job = json.loads(proc.stdout)
            job_dir = Path(job["job_dir"])
            wait_for(lambda: all(f"ready-{r}" in read_logs(job_dir) for r in (0, 1)), 120, what="both ranks ready")
            start = time.time()
            subprocess.run(["scancel", job["job_id"]], env={**os.environ, **cluster.target.env}, check=True)
            assert slurm.wait(cluster.target, job["job_id"], timeout=120).state == "CANCELLED"
        logs = read_logs(job_dir)
        assert "the command did not stop 3 s after the stop signal: killing it" in logs, logs
        records = {r: (job_dir / "logs" / f"exit.r0.rank-{r}").read_text().split() for r in (0, 1)}
        assert {r: words[1:] for r, words in records.items()} == {0: ["0", "137", "stopped"], 1: ["1", "143", "stopped"]}, \
            records
        # Each launcher ended seconds after the cancel (the stop grace: 3 s), not at KillWait (30 s); what pyxis
        # does after the tasks (create mode's removal of the unpacked image) is pyxis's.
        took = max(int(words[0]) / 1e9 for words in records.values()) - start
        assert took < 15, f"the ranks ended {took:.1f} s after the cancel (KillWait: 30 s)\n{logs}"
        assert f"rank 1: handler: /dev/null: {SEEN[mode]}" in logs, logs
        assert "cannot redirect" not in logs, logs
        assert_nothing_left(cluster, Waiting(None, job["job_id"], job_dir))
        wait_for(lambda: fuse_daemons(cluster) == [], 30, what="the step's FUSE daemons to end with it")
    finally:
        shutil.rmtree(out, ignore_errors=True)


def stray_teardown_lines(logs: str) -> list[str]:
    """A launcher's lines saying its teardown found processes below its task: the command's, or its own
    forks'. The command here leaves none, and kit's own are all stopped before the tree is swept."""
    return [line for line in logs.splitlines() if "left below the task" in line or "own subshell" in line]


def failed_and_cancelled(cluster, cpu_image, tmp_path):
    loops_before, mounts_before = loops_and_mounts(cluster)

    class W:
        def __init__(self, job):
            self.job_id, self.job_dir = job["job_id"], Path(job["job_dir"])
    failed = submit(tmp_path, "--nodes", "2", "--image", str(cpu_image),
                    command=["bash", "-c", 'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 60'])
    end = slurm.wait(cluster.target, failed["job_id"], timeout=180)
    assert (end.state, end.exit_code) == ("FAILED", 3), read_logs(failed["job_dir"])
    logs = read_logs(failed["job_dir"])
    assert "task 1: Exited with exit code 3" in logs and "Transport endpoint" not in logs, logs
    # Every node holds the runtime's processes below its rank: none is the job's, and each launcher's
    # teardown is its own (a helper signalled as it was forked once ran a second one beside it).
    assert not stray_teardown_lines(logs), logs
    assert_nothing_left(cluster, W(failed))
    cancelled = submit(tmp_path, "--nodes", "2", "--image", str(cpu_image), command=["bash", "-c", 'echo "ready-$RANK"; sleep 300'])
    wait_for(lambda: all(f"ready-{r}" in read_logs(cancelled["job_dir"]) for r in (0, 1)), 120,
             what="both ranks in their containers")
    subprocess.run(["scancel", cancelled["job_id"]], env={**os.environ, **cluster.target.env}, check=True)
    assert slurm.wait(cluster.target, cancelled["job_id"], timeout=120).state == "CANCELLED"
    assert not stray_teardown_lines(read_logs(cancelled["job_dir"])), \
        read_logs(cancelled["job_dir"])
    assert_nothing_left(cluster, W(cancelled))
    assert released(cluster, (loops_before, mounts_before))


@pytest.fixture(scope="module")
def base_image(debian_base, tmp_path_factory) -> Path:
    """The Debian base as an image with no /etc/rc and no PATH in /etc/environment."""
    out = tmp_path_factory.mktemp("base-image") / "debian.sqsh"
    subprocess.run(["mksquashfs", str(debian_base), str(out), "-quiet", "-no-progress", "-comp", "lz4"],
                   check=True, timeout=600)
    return out


def srun(cluster, *args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """srun straight on the local cluster: the container plugin alone, without kit's scripts."""
    return subprocess.run(["srun", "-N1", *args], env={**os.environ, **cluster.target.env, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


PROBE = 'echo "pwd=$(pwd) shell=${SHELL-unset} term=${TERM-unset} path=$PATH home=$HOME user=$USER"'


def test_login_environment_and_default_workdir_follow_pyxis(cluster, cpu_image, base_image):
    """PYXIS.md, "Inside the container": the login variables (HOME, USER, SHELL, a
    default PATH) win over the task's, /etc/environment wins over them, and names in
    --container-env keep the task's value; the working directory is the image's WORKDIR
    (from /etc/rc), or HOME for an image without /etc/rc. Values as enroot sets them: PATH
    from the image's login.defs ENV_SUPATH (as root); TERM from its environ.d (TERM=${TERM}):
    the task's own, empty when the task has none."""
    task = {"TERM": "xterm", "SHELL": "/bin/zsh", "PATH": os.environ["PATH"] + ":/host/only", "HOME": "/home/alice"}
    proc = srun(cluster, f"--container-image={base_image}", "bash", "-c", PROBE, env=task)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["pwd=/root", "shell=/bin/bash", "term=xterm",
                                   "path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                   "home=/root", "user=root"], proc.stdout
    no_term = {k: v for k, v in os.environ.items() if k != "TERM"}
    proc = subprocess.run(["srun", "-N1", f"--container-image={base_image}", "bash", "-c", 'echo "term=[${TERM-unset}]"'],
                          env={**no_term, **cluster.target.env}, capture_output=True, text=True, timeout=180)
    assert proc.stdout.strip() == "term=[]", proc.stdout + proc.stderr
    # /sys read-only; the host's /etc/hostname and /etc/machine-id (PYXIS.md, "Mounts inside").
    look = ('touch /sys/kit-probe 2>/dev/null && echo sys-writable || echo sys-ro; cat /etc/hostname; '
            'cat /etc/machine-id 2>/dev/null || echo no-machine-id; stat -c "tmp=%a" /tmp')
    proc = srun(cluster, f"--container-image={base_image}", "bash", "-c", look)
    host = [Path("/etc/hostname").read_text().strip() if Path("/etc/hostname").exists() else "",
            Path("/etc/machine-id").read_text().strip() if Path("/etc/machine-id").exists() else "no-machine-id"]
    # /tmp is a tmpfs of mode 0755, as enroot 4.1.2 makes it, not 1777.
    assert proc.stdout.split("\n")[:4] == ["sys-ro", *host, "tmp=755"], proc.stdout + proc.stderr
    # The cpu image: WORKDIR /workspace through its /etc/rc; its ENV PATH (/etc/environment)
    # wins over the login PATH; TERM listed in --container-env keeps the task's value.
    proc = srun(cluster, f"--container-image={cpu_image}", "--container-env=TERM", "bash", "-c", PROBE, env=task)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["pwd=/workspace", "shell=/bin/bash", "term=xterm",
                                   "path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                   "home=/root", "user=root"], proc.stdout


def test_tasks_of_a_node_share_one_container(cluster, cpu_image):
    """PYXIS.md: one container per node per step, shared by that node's tasks (a shared
    /tmp, and with --container-writable a shared root filesystem)."""
    loops_before, mounts_before = loops_and_mounts(cluster)
    share = ('if [ "$SLURM_PROCID" = 0 ]; then echo from-0 > /tmp/shared; echo from-0 > /opt/shared; fi; '
             'for i in $(seq 100); do [ -e /tmp/shared ] && [ -e /opt/shared ] && break; sleep 0.1; done; '
             'echo "task $SLURM_PROCID sees $(cat /tmp/shared /opt/shared 2>/dev/null | tr "\\n" " ")"')
    proc = srun(cluster, "-n2", f"--container-image={cpu_image}", "--container-writable", "bash", "-c", share)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["task 0 sees from-0 from-0 ", "task 1 sees from-0 from-0 "], proc.stdout
    # The container lived in the step's own mount namespace: nothing of it is left.
    assert released(cluster, (loops_before, mounts_before))


def test_a_named_container_persists_on_its_node_with_its_writes(cluster, base_image, tmp_path):
    """PYXIS.md: --container-name keeps the container (pyxis_NAME) in the node's data path
    after the job, with its writes when writable; a later job with the name reuses it
    ("pyxis: reusing existing container filesystem"), even when given another image."""
    name = f"kit-test-{os.getpid()}"
    kept = named_containers(cluster, "node1") / f"pyxis_{name}"
    try:
        with container_scope(cluster, "global"):
            _persist_and_reuse(cluster, base_image, name, kept)
    finally:
        # What `kit cluster down` does for every node (tests/test_cluster.py checks it).
        subprocess.run(["rm", "-rf", str(kept)], check=True)


def _persist_and_reuse(cluster, base_image, name: str, kept: Path) -> None:
    """The named container's life in pyxis's global scope (see the test above)."""
    first = srun(cluster, "-w", "node1", f"--container-image={base_image}", f"--container-name={name}",
                 "--container-writable", "bash", "-c", "echo written-by-the-first > /root/note; cat /etc/debian_version")
    assert first.returncode == 0, first.stderr
    assert (kept / "root" / "note").read_text() == "written-by-the-first\n"
    second = srun(cluster, "-w", "node1", f"--container-name={name}", "cat", "/root/note")
    assert second.returncode == 0, second.stderr
    assert second.stdout == "written-by-the-first\n"
    # pyxis says so in the slurmd log, not on srun's stderr (PYXIS.md).
    log = (cluster.root / "log" / "slurmd-node1.log").read_text(errors="replace")
    assert "pyxis: reusing existing container filesystem" in log
    assert "reusing existing container filesystem" not in second.stderr, second.stderr
    # Read-only unless --container-writable, also when reused.
    third = srun(cluster, "-w", "node1", f"--container-name={name}", "bash", "-c", "touch /root/x || echo refused")
    assert third.stdout.strip().endswith("refused"), third.stdout + third.stderr
    # Another node has no such container and no image was given: a clear error, exit 1.
    missing = srun(cluster, "-w", "node2", f"--container-name={name}", "true")
    assert missing.returncode == 1 and "pyxis" in missing.stderr, missing.stderr
    if cluster.state().containers == "kit-pyxis":  # the stand-in's own words
        assert f"pyxis: error: no container named {name} on this node" in missing.stderr, missing.stderr


def test_under_container_scope_job_kit_names_the_container_and_the_job_epilog_removes_it(cluster, base_image,
                                                                                          tmp_path):
    """pyxis's container_scope=job in create mode: kit names the container (pyxis_JOBID_kit on each node, as
    pyxis names a job's), so that the job epilog, not the step, removes it: the job ends COMPLETED, its
    containers are there while it runs and gone after, on every node, and the nodes stay up. A name the user
    gives is theirs; in pyxis's global scope kit names nothing."""
    from kit import api, slurm
    from kit.slurm import pyxis

    data = [named_containers(cluster, f"node{i}") for i in (1, 2)]
    with container_scope(cluster, "global"):  # pyxis's default: named containers stay
        assert not pyxis.epilog_removes(slurm.pyxis_settings(cluster.target))
    with container_scope(cluster, "job"):
        assert slurm.pyxis_settings(cluster.target)["container_scope"] == "job"
        job = submit(tmp_path, "--nodes", "2", "--image", str(base_image), "--no-exporter",
                     command=["bash", "-c", "sleep 4; echo ran in $(cat /etc/debian_version)"])
        job_dir, job_id = Path(job["job_dir"]), job["job_id"]
        assert "--container-name=kit" in (job_dir / "prelaunch.sh").read_text()
        kept = [d / f"pyxis_{job_id}_kit" for d in data]
        wait_for(lambda: all(k.is_dir() for k in kept), 120, what="the job's named container on both nodes")
        end = api.Job(job_dir).wait(timeout=180)
        assert (end.state, end.exit_code) == ("COMPLETED", 0), read_logs(job_dir)
        assert "ran in 12." in read_logs(job_dir)
        wait_for(lambda: not any(k.exists() for k in kept), 30, what="the job epilog removing its containers")
        assert not [p.name for d in data for p in d.iterdir() if p.name.startswith(f"pyxis_{job_id}")]
        mine = submit(tmp_path, "--image", str(base_image), "--container-name", "mine", "--dry-run", command=["true"])
        assert "--container-name=mine" in " ".join(mine["sbatch_argv"]) or \
            "--container-name=mine" in (Path(mine["job_dir"]) / "prelaunch.sh").read_text()
    nodes = subprocess.run(["sinfo", "-h", "-o", "%t"], env={**os.environ, **cluster.target.env},
                           capture_output=True, text=True).stdout.split()
    assert set(nodes) == {"idle"}, nodes


def test_a_node_repaired_from_a_shell_with_another_path_still_runs_containers(cluster, base_image, tmp_path):
    """node2's slurmd dies; `kit cluster up` repairs it from a shell whose
    PATH lacks enroot's directory (nothing under /usr/local: enroot built from source lives
    there) and Slurm's own tools are found by kit; container jobs on both nodes
    still run (real pyxis: the per-node enroot wrapper puts enroot's helpers on PATH itself)."""
    import signal

    from kit.cluster.processes import alive as _alive

    st = cluster.state()
    os.kill(st.pids["node2"], signal.SIGKILL)
    wait_for(lambda: not _alive(st.pids["node2"], "slurmd"), 10, what="node2's slurmd to die")
    bare = f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin"
    env = {"PATH": bare, "KIT_HOME": os.environ["KIT_HOME"], "HOME": os.environ.get("HOME", "/root")}
    up = subprocess.run([sys.executable, "-m", "kit", "cluster", "up"], env=env, capture_output=True, text=True,
                        timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "restarting node2" in up.stderr + up.stdout
    assert cluster.running() and cluster.state().pids["node2"] != st.pids["node2"]
    proc = kit("launch", "--local", "--nodes", "2", "--wait", "--image", str(base_image), "--output-dir",
               str(tmp_path / "jobs"), "--", "bash", "-c", 'echo "in $(. /etc/os-release; echo $ID) on $SLURMD_NODENAME"',
               cwd=tmp_path, timeout=300)
    job_dir = re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1)
    assert proc.returncode == 0, proc.stderr + read_logs(job_dir)
    assert sorted(re.findall(r"^\d: in debian on (node\d)$", read_logs(job_dir), re.M)) == ["node1", "node2"]


def test_bench_container_quick(cluster, cpu_image, tmp_path):
    """bench/bench_container.py --quick runs: one pair of 10-step jobs."""
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_container.py"), "--quick", "--image",
                           str(cpu_image), "--output-dir", str(tmp_path / "jobs")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "first step, squashfuse / create:" in proc.stdout and "create mode's end of the job beyond the host's" in proc.stdout, proc.stdout


def test_container_options_on_sbatch_and_salloc_follow_pyxis(cluster, cpu_image, tmp_path):
    """PYXIS.md: pyxis takes its flags on sbatch (the batch script itself runs in the image,
    its script bound in from slurmd's spool directory) and on salloc (the allocation's steps
    inherit them). kit puts them on the srun step; a user's own sbatch line may not."""
    env = {**os.environ, **cluster.target.env}
    out = tmp_path / "batch.out"
    sub = subprocess.run(["sbatch", "--parsable", "-N1", f"--container-image={cpu_image}", f"--output={out}",
                          "--wrap", 'test -e /.kit/image.json && echo "batch inside the image"'],
                         env=env, capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    end = slurm.wait(cluster.target, sub.stdout.strip().split(";")[0], timeout=180)
    assert end.state == "COMPLETED", out.read_text() if out.exists() else end
    assert out.read_text().strip() == "batch inside the image", out.read_text()
    alloc = subprocess.run(["salloc", "-N1", f"--container-image={cpu_image}", "srun", "bash", "-c",
                            'test -e /.kit/image.json && echo "step inside the image"'],
                           env=env, capture_output=True, text=True, timeout=180)
    assert alloc.returncode == 0 and alloc.stdout.strip() == "step inside the image", alloc.stdout + alloc.stderr


def test_a_function_job_runs_in_a_kit_built_image(cluster, cpu_image, tmp_path):
    """Under an image: the call is unpickled by the image's python3 (same
    minor version, cloudpickle built in: checked from the image's file list before submitting)."""
    import kit as kitlib

    def where_am_i(tag):
        import os
        import sys

        return {"tag": tag, "rank": int(os.environ["RANK"]), "python": sys.executable,
                "kit_runtime": os.path.isdir("/opt/kit/python")}

    job = kitlib.submit(where_am_i, "img", nodes=2, image=str(cpu_image), local=True, output_dir=tmp_path / "jobs",
                        no_exporter=True)
    results = job.results(timeout=600)
    assert [r["rank"] for r in results] == [0, 1] and {r["tag"] for r in results} == {"img"}
    assert {r["python"] for r in results} == {"/usr/bin/python3"} != {sys.executable}
    assert {r["kit_runtime"] for r in results} == {True} and not Path("/opt/kit/python").exists()  # in the image


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@kit", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def _image_with_marker(debian_base: Path, out: Path, marker: str) -> None:
    subprocess.run(["mksquashfs", str(debian_base), str(out), "-noappend", "-quiet", "-no-progress", "-comp", "lz4",
                    "-p", f"etc/kit-test-image f 444 0 0 echo {marker}"], check=True, timeout=600)


def test_a_held_job_runs_the_code_and_image_it_was_submitted_with(cluster, debian_base, tmp_path):
    """A job held in the queue while its script is edited, its
    ignored data changed and its image file rebuilt in place runs the submitted script and
    image (by content) and the data as it is now; so does its requeued run, after another
    edit and a commit; job.json names the commit, the tree's cleanliness, the snapshot and the
    image digests; kit rerun of it runs the same snapshot and image again."""
    import hashlib

    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / ".gitignore").write_text("data/\n")
    script = ('echo "code=%s image=$(cat /etc/kit-test-image) data=$(cat data/input.txt) run=$KIT_RESTART"; '
              'if [ -e data/hold ]; then trap "exit 0" TERM; echo ready; sleep 300 & wait; fi\n')
    (repo / "run.sh").write_text(script % "v1")
    (repo / "data" / "input.txt").write_text("data-1\n")
    (repo / "data" / "hold").write_text("")
    _git(repo, "init", "-q")
    _git(repo, "add", "run.sh", ".gitignore")
    _git(repo, "commit", "-qm", "v1")
    commit = _git(repo, "rev-parse", "HEAD")
    image = tmp_path / "img.sqsh"
    _image_with_marker(debian_base, image, "A")
    digest_a = "sha256:" + hashlib.sha256(image.read_bytes()).hexdigest()

    proc = kit("launch", "--local", "--image", str(image), "--no-exporter", "--heartbeat", "0",
               "--sbatch-arg=--hold", "--output-dir", str(tmp_path / "jobs"), "--", "bash", "run.sh", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    job_id = re.search(r"^Submitted job (\d+)$", proc.stdout, re.M).group(1)
    job_dir = Path(re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1))
    assert slurm.job_status(cluster.target, job_id).state == "PENDING"
    # While it waits: the script edited, the data changed, the image file rebuilt in place.
    (repo / "run.sh").write_text(script % "v2")
    (repo / "data" / "input.txt").write_text("data-2\n")
    small = tmp_path / "b-root" / "etc"
    small.mkdir(parents=True)
    (small / "kit-test-image").write_text("B\n")
    subprocess.run(["mksquashfs", str(small.parent), str(image), "-noappend", "-quiet", "-no-progress"], check=True)
    subprocess.run(["scontrol", "release", job_id], env={**os.environ, **cluster.target.env}, check=True)

    wait_for(lambda: "0: ready" in read_logs(job_dir), 240, what="the first run to start")
    assert "0: code=v1 image=A data=data-2 run=0" in read_logs(job_dir)
    # Edited and committed again; an admin requeues it: the requeued run runs the snapshot too.
    (repo / "run.sh").write_text(script % "v3")
    _git(repo, "commit", "-qam", "v3")
    (repo / "data" / "hold").unlink()
    subprocess.run(["scontrol", "requeue", job_id], env={**os.environ, **cluster.target.env}, check=True)
    from helpers import release_requeued

    release_requeued(cluster, job_id, job_dir)
    wait_for(lambda: slurm.job_status(cluster.target, job_id).state == "COMPLETED", 240, what="the job to end")
    logs = read_logs(job_dir)
    assert "0: code=v1 image=A data=data-2 run=1" in logs, logs
    assert (job_dir / "FINISHED").exists()
    spec = json.loads((job_dir / "job.json").read_text())
    snap = spec["snapshot"]
    assert (snap["commit"], snap["dirty"], snap["root"], snap["files"]) == (commit, False, str(repo), 2), snap
    assert snap["digest"].startswith("sha256:") and spec["image_digest"] == digest_a
    assert spec["image_source"] == str(image) and spec["image"] != str(image)
    assert (job_dir / "code" / "run.sh").read_text() == script % "v1"

    # kit rerun: the same resolved spec (but for the hold), snapshot and image, run again from anywhere.
    proc = kit("rerun", str(job_dir), "--edit", "sbatch_args=[]", "--wait", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    again = Path(re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1))
    respec = json.loads((again / "job.json").read_text())
    assert respec.pop("sbatch_args") == [] and spec.pop("sbatch_args") == ["--hold"]
    assert respec == spec, (respec, spec)
    assert "0: code=v1 image=A data=data-2 run=0" in read_logs(again)
    assert (again / "FINISHED").exists()
