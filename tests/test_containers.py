"""Container jobs on the local cluster: the shipped CPU recipe built on a locally made Debian base, run as a
2-node Lightning DDP job through the pyxis flags kit puts on the srun step. The jobs are an ordinary user's
(``person``: created by the session, kit in their venv, their image and directories in their home), as on a
site; root does here what an admin does (builds, the cluster's settings, a node's repair)."""

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
from helpers import (
    NO_DEVICES,
    REPO,
    Waiting,
    assert_nothing_left,
    container_mode,
    container_scope,
    job_dir_of,
    kit,
    launched,
    named_containers,
    read_logs,
    skip_where_squashfuse_is_closed,
    wait_for,
    wait_no_processes,
)

from kit import slurm


@pytest.fixture(scope="module")
def small_image(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("small")
    (d / "root" / "usr" / "bin").mkdir(parents=True)
    out = d / "small.sqsh"
    subprocess.run(["mksquashfs", str(d / "root"), str(out), "-quiet", "-no-progress"], check=True)
    return out


def released(cluster, person, before: tuple[list[str], list[str]], timeout: float = 30) -> bool:
    """True once the cluster's loop devices and mounts are as ``before``: srun returns when the tasks
    end, and slurmstepd takes the container down just after (its mount namespace)."""
    wait_for(
        lambda: loops_and_mounts(cluster, person) == before,
        timeout,
        poll=0.2,
        what="the container's loop device and mounts to go",
    )
    return True


def loops_and_mounts(cluster, person) -> tuple[list[str], list[str]]:
    """The loop devices of this cluster's or the person's images (their files under its KIT_HOME or the
    person's home) and the mounts of them or of those directories: another cluster on the machine (CI may run
    one beside) has its own."""
    homes = (str(cluster.home), person.entry.pw_dir)
    loops = [
        line
        for line in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout.splitlines()
        if any(h in line for h in homes)
    ]
    devices = {line.split(":")[0] for line in loops}
    mounts = [
        line
        for line in Path("/proc/mounts").read_text().splitlines()
        if line.split()[0] in devices or ("kit-pyxis" in line and any(h in line for h in homes))
    ]
    return loops, mounts


def fuse_daemons(person) -> list[str]:
    """squashfuse (and fuse-overlayfs, where enroot has no native overlay) processes of the person's jobs (the
    runtime's, under squashfuse mode, run as the job's user), or of root's jobs of their images (named by path,
    under their home): the test made the person, all those are its."""
    out = subprocess.run(["pgrep", "-a", "-x", "squashfuse|fuse-overlayfs"], capture_output=True, text=True).stdout
    uids = subprocess.run(
        ["pgrep", "-u", str(person.uid), "-x", "squashfuse|fuse-overlayfs"], capture_output=True, text=True
    ).stdout.split()
    return [line for line in out.splitlines() if line.split()[0] in uids or f"{person.entry.pw_dir}/" in line]


@pytest.mark.parametrize("mode", ["create", "squashfuse"])
def test_two_node_lightning_job_runs_inside_the_image(cluster, person, user_image, mode):
    """The README's main job in each of pyxis's modes, an ordinary user's: its ranks their uid on the host. In
    squashfuse mode the node's first task has the runtime's FUSE daemons below it for the whole step: the
    job ends COMPLETED 0 (a teardown that stopped them failed it with the root gone:
    "Transport endpoint is not connected"), and nothing of them is left after it."""
    skip_where_squashfuse_is_closed(cluster, mode)
    with container_mode(cluster, mode):
        two_node_lightning_job(cluster, person, user_image, mode)


def two_node_lightning_job(cluster, person, image, mode):
    assert cluster.state().containers in ("kit-pyxis", "pyxis")
    assert fuse_daemons(person) == []
    slurmd_log = cluster.root / "log" / "slurmd-node1.log"
    slurmd_log_at = slurmd_log.stat().st_size
    host = person.dir / "host-data"
    host.mkdir()
    (host / "from-host.txt").write_text("host file\n")
    person.own(host)
    loops_before, mounts_before = loops_and_mounts(cluster, person)
    probe = (
        'echo "rank=$RANK marker=$(cat /.kit/image.json | head -c 1) pwd=$(pwd) uid=$(id -u) '
        'pu=$PYTHONUNBUFFERED ma=$MASTER_ADDR mp=$MASTER_PORT host=$(cat /data/from-host.txt)" '
        '> "/data/probe-$RANK.txt"; '
        # --step-delay: the training spans several exporter polls, so the report has a throughput to draw
        "exec python3 -m kit.train --max-steps 30 --step-delay 0.1 --checkpoint-every 10 --no-snapshots --checkpoint-dir /data/ckpt"
    )
    proc = person.kit(
        "launch",
        "--nodes",
        "2",
        "--wait",
        "--image",
        str(image),
        "--mount",
        f"{host}:/data",
        "--env",
        "PYTHONUNBUFFERED=from-the-job",
        "--output-dir",
        str(person.dir / "jobs"),
        "--",
        "bash",
        "-c",
        probe,
        timeout=600,
    )
    job_dir = job_dir_of(proc)
    assert proc.returncode == 0, proc.stderr + read_logs(job_dir)
    assert not Path("/.kit/image.json").exists()  # the marker exists only in the image
    for rank in (0, 1):
        line = (host / f"probe-{rank}.txt").read_text()
        assert f"rank={rank} marker={{" in line  # /.kit/image.json was readable: inside the image
        assert f" uid={person.uid} " in line  # the user's own uid on the host
        assert f"pwd={person.dir} " in line  # where it was submitted (outside git: mounted there, as sbatch starts)
        assert "pu=from-the-job " in line  # the job's value beat the image's ENV (=1)
        assert re.search(r"ma=\S+ mp=\d+ host=host file", line)
    logs = read_logs(job_dir)
    assert re.search(r"rank=0 world_size=2", logs) and re.search(r"rank=1 world_size=2", logs)
    assert "done at step=30" in logs
    assert (host / "ckpt" / "last.ckpt").stat().st_size > 0  # written through the mount
    assert os.stat(host / "ckpt" / "last.ckpt").st_uid == person.uid
    assert wait_no_processes(job_dir, 5) == []
    assert released(cluster, person, (loops_before, mounts_before))
    # kit report on this, the README's main job: the exporter in the
    # container saw the job's processes; panels for what was measured, numbers from the logs.
    from report_check import check

    rep = person.kit("report", job_dir, "--prometheus", "http://127.0.0.1:1")
    assert rep.returncode == 0, rep.stderr
    summary = json.loads((Path(job_dir) / "report.json").read_text())
    assert summary["panels"] == [
        "CPU (cores busy)",
        "Memory (GiB)",
        "Training loss",
        "Step time (s)",
        "Model TFLOP/s per device",
        "Training throughput (samples/s)",
    ], summary["panels"]
    assert summary["tflops"] > 0 and summary["mfu"] is None  # measured in the image; on CPUs no MFU
    want = check(Path(job_dir), summary, rep.stdout)
    assert all(n["cpu_cores_used"] > 0 and n["memory_peak_bytes"] > 50 * 2**20 for n in want["nodes"].values())
    # The container's start, per node and run, in report.json, the text and kit ps.
    starts = summary["task_starts"]
    assert sorted(t["node"] for t in starts) == ["node1", "node2"] and {t["run"] for t in starts} == {0}, starts
    assert all(0 < t["seconds"] < 300 for t in starts), starts
    assert "task start after srun (with an image: the container's start): run 0: node1 " in rep.stdout, rep.stdout
    rows = json.loads(person.kit("ps", "--json", "--all", "--output-dir", str(person.dir / "jobs")).stdout)
    (row,) = [r for r in rows if r["job_dir"] == str(Path(job_dir).resolve())]
    assert sorted(row["task_start"]) == ["node1", "node2"], row
    # Which mode each node ran, from the task itself (its root's file system), in report.json
    # and the text; the status says the cluster's; pyxis's own words in the slurmd log.
    assert [t["mode"] for t in starts] == [mode, mode], starts
    assert f"container: {mode} mode (" in rep.stdout and "on node1, node2" in rep.stdout, rep.stdout
    status = kit("cluster", "status").stdout  # the admin's view
    assert f"; {mode} mode (" in status, status
    with open(slurmd_log, errors="replace") as f:
        f.seek(slurmd_log_at)
        skipped = "skipping container creation (squashfuse enabled)" in f.read()
    assert skipped == (mode == "squashfuse")
    assert "Transport endpoint is not connected" not in logs
    wait_for(lambda: fuse_daemons(person) == [], 30, what="the step's FUSE daemons to end with it")


def image_listing(image: Path) -> list[str]:
    """``unsquashfs -lls`` rows, but for kit's own provenance file (it names the recipe)."""
    out = subprocess.run(["unsquashfs", "-lls", str(image)], capture_output=True, text=True, check=True).stdout
    return [
        line
        for line in out.splitlines()
        if line.startswith(("d", "-", "l", "c", "b", "p", "s")) and not line.endswith("squashfs-root/.kit/image.json")
    ]


def test_the_dockerfile_builds_the_same_image_as_the_toml_recipe(cluster, cpu_image, image_cache, person, monkeypatch):
    """containers/cpu-lightning.Dockerfile and .toml give the same file
    tree and enroot metadata (the Dockerfile's build finds the TOML build's layers in the
    cache: same steps, same keys), and the README's main job runs in the Dockerfile's image (the user's)."""
    from kit.image.builder import cache_dir

    # The TOML build's cache (conftest's image_cache); its whole image, kept there, would be taken as it is
    # (the same key), and no step would be looked up.
    with monkeypatch.context() as m:
        m.setenv("KIT_HOME", str(image_cache))
        images = cache_dir()
    for cached in images.glob("*.sqsh"):
        cached.unlink()
    out = person.dir / "from-dockerfile.sqsh"
    proc = kit(
        "build",
        *(str(REPO / "containers"), "-f", "cpu-lightning.Dockerfile", "-o", str(out)),
        env={"KIT_HOME": str(image_cache)},
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr
    person.own(out)
    assert "cached: pip: " in proc.stderr and "cached: kit: " in proc.stderr, proc.stderr
    assert image_listing(out) == image_listing(cpu_image)
    for name in ("etc/environment", "etc/rc", "etc/fstab"):
        read = [
            subprocess.run(["unsquashfs", "-cat", str(i), name], capture_output=True, text=True).stdout
            for i in (out, cpu_image)
        ]
        assert read[0] == read[1], name
    job = person.kit(
        "launch",
        "--nodes",
        "2",
        "--wait",
        "--image",
        str(out),
        "--output-dir",
        str(person.dir / "jobs"),
        "--",
        "python3",
        "-m",
        "kit.train",
        "--max-steps",
        "20",
        timeout=600,
    )
    job_dir = job_dir_of(job)
    assert job.returncode == 0, job.stderr + read_logs(job_dir)
    assert "done at step=20" in read_logs(job_dir)


def test_console_scripts_are_on_path_and_torchrun_forms_one_world_in_the_image(cluster, person, user_image):
    """Every console script the image's pip step installed runs (none
    exits 126 or 127: on PATH, its #! naming the image's python), and the manual's torchrun
    example with --image, as written there, forms one world of 4 on 2 nodes (the user's copy of the examples)."""
    listing = subprocess.run(
        ["unsquashfs", "-lc", str(user_image), "usr/local/bin"], capture_output=True, text=True
    ).stdout
    scripts = sorted(line.rsplit("/", 1)[1] for line in listing.splitlines() if "/usr/local/bin/" in line)
    assert {"torchrun", "fabric", "tqdm"} <= set(scripts), listing
    probe = (
        'for s in /usr/local/bin/*; do timeout 120 "$s" --help </dev/null >/dev/null 2>&1; '
        'echo "script $(basename "$s") $? $(head -c 60 "$s" | head -n 1)"; done'
    )
    proc = person.kit(
        "launch",
        "--wait",
        "--image",
        str(user_image),
        "--output-dir",
        str(person.dir / "jobs"),
        "--",
        "bash",
        "-c",
        probe,
        timeout=900,
    )
    job_dir = job_dir_of(proc)
    assert proc.returncode == 0, proc.stderr + read_logs(job_dir)
    ran = {
        m.group(1): (int(m.group(2)), m.group(3))
        for m in re.finditer(r"script (\S+) (\d+) (.*)$", read_logs(job_dir), re.M)
    }
    assert sorted(ran) == scripts
    assert [name for name, (code, _) in ran.items() if code in (126, 127)] == [], ran
    assert all(line == "#!/usr/bin/python3" for _, line in ran.values() if line.startswith("#!")), ran
    # The manual's example (launch/examples reaches the container through --mount), from the user's checkout.
    shutil.copytree(REPO / "launch" / "examples", person.dir / "launch" / "examples")
    person.own(person.dir / "launch")
    readme = "".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])
    line = next(ln.strip() for ln in readme.splitlines() if "--image" in ln and "torchrun --nproc-per-node 2" in ln)
    args = shlex.split(line.replace("$PWD", str(person.dir)).replace("cpu-lightning.sqsh", str(user_image)))
    assert args[:2] == ["kit", "launch"], line
    proc = person.kit("launch", "--wait", "--output-dir", str(person.dir / "jobs"), *args[2:], timeout=900)
    job_dir = job_dir_of(proc)
    assert proc.returncode == 0, proc.stderr + read_logs(job_dir)
    logs = read_logs(job_dir)
    assert "world=4" in logs and "fsdp2 done" in logs, logs


def test_an_image_without_bash_is_refused_before_submitting(small_image, tmp_path):
    proc = kit("launch", "--dry-run", "--image", str(small_image), "--output-dir", str(tmp_path / "jobs"), "--", "true")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == (
        f"kit: --image: {small_image} has no bash or tee, which launcher.sh needs inside the container"
    )
    assert not (tmp_path / "jobs").exists()


def test_container_workdir_must_exist(cluster, person, user_image):
    proc = person.kit(
        "launch",
        "--wait",
        "--image",
        str(user_image),
        "--container-workdir",
        "/not/there",
        "--output-dir",
        str(person.dir / "jobs"),
        "--",
        "true",
        timeout=120,
    )
    job_dir = job_dir_of(proc)
    assert proc.returncode != 0
    # PYXIS.md: the task fails with pyxis's "couldn't chdir to /not/there: No such file or
    # directory" (the stand-in says it with its own tag): the words both plugins share.
    assert re.search(
        r"(pyxis|kit-pyxis): couldn't chdir to /not/there: No such file or directory", read_logs(job_dir)
    ), read_logs(job_dir)
    # No rank started: kit logs and --errors show the batch log's story.
    logs = person.kit("logs", job_dir)
    assert logs.returncode == 0 and "couldn't chdir to /not/there" in logs.stdout, logs.stdout + logs.stderr
    assert logs.stderr.startswith("kit: no rank of run 0 has a log")
    errors = person.kit("logs", job_dir, "--errors")
    assert errors.stdout.startswith("run 0 failed (exit code ") and "couldn't chdir to /not/there" in errors.stdout, (
        errors.stdout
    )


def test_environment_and_mount_flags_follow_pyxis(cluster, person, user_image):
    """PYXIS.md, "Inside the container": the task loses LANG, LANGUAGE and LC_ALL; the
    login variables (USER, LOGNAME, HOME: the job user's, whatever the task had) and the image's
    /etc/environment win over the task's values except names in --container-env (kit adds --env names);
    every accepted mount flag is honoured (ro+nosuid+noexec here). The same lines from real pyxis 0.24 +
    enroot 4.1.2 and the stand-in."""
    host = person.dir / "host"
    host.mkdir()
    (host / "tool.sh").write_text("#!/bin/sh\necho ran\n")
    (host / "tool.sh").chmod(0o755)
    person.own(host)
    probe = (
        'echo "lang=${LANG-unset} language=${LANGUAGE-unset} lc_all=${LC_ALL-unset} user=${USER-unset} '
        'logname=${LOGNAME-unset} home=${HOME-unset} uid=$(id -u)"; '
        'grep " /data " /proc/self/mountinfo | cut -d" " -f6; '
        '/data/tool.sh || echo "exec refused"; touch /data/x 2>/dev/null || echo "write refused"'
    )
    elsewhere = person.dir / "elsewhere"  # the task's HOME, theirs (kit keeps its state under it), not the login's
    elsewhere.mkdir()
    person.own(elsewhere)
    env = {"LANG": "en_US.UTF-8", "LANGUAGE": "en", "HOME": elsewhere, "USER": "alice", "LOGNAME": "alice"}
    proc = person.kit(
        "launch",
        "--wait",
        "--image",
        str(user_image),
        "--env",
        "LC_ALL=C",
        "--mount",
        f"{host}:/data:ro+nosuid+noexec",
        "--output-dir",
        str(person.dir / "jobs"),
        "--",
        "bash",
        "-c",
        probe,
        env=env,
        timeout=300,
    )
    job_dir = job_dir_of(proc)
    assert proc.returncode == 0, proc.stderr + read_logs(job_dir)
    out = (Path(job_dir) / "logs" / "rank-0.r0.log").read_text().splitlines()
    # LANGUAGE is removed; LANG is the image's (its ENV), not the task's; LC_ALL came with --env,
    # so kit lists it in --container-env: it is kept.
    assert out[0] == (
        f"lang=C.UTF-8 language=unset lc_all=C user={person.name} logname={person.name} "
        f"home={person.entry.pw_dir} uid={person.uid}"
    ), out
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
    proc = kit(
        "launch", "--dry-run", "--image", str(small_image), "--output-dir", str(tmp_path / "jobs"), *args, "--", "true"
    )
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


def test_a_container_job_from_a_directory_outside_git_runs_its_script(cluster, person, user_image):
    """A user's directory that is not a git work tree (no code snapshot): `kit launch --image IMG -- python3
    train.py` started in the image's WORKDIR with the directory not mounted (`python3: can't open file …`, 20 s after
    submission). As without --image and as sbatch, it starts in the submission directory, mounted into the
    container: the script runs, and what it writes there is in the user's directory."""
    work = person.dir / "project"
    work.mkdir()
    (work / "train.py").write_text(
        "import os\nopen('out.txt', 'w').write(os.getcwd())\nprint('trained in', os.getcwd())\n"
    )
    person.own(work)
    proc = person.kit(
        "launch",
        "--wait",
        "--no-exporter",
        "--image",
        str(user_image),
        "--",
        "python3",
        "train.py",
        cwd=work,
        timeout=300,
    )
    job_dir = job_dir_of(proc)
    assert proc.returncode == 0, proc.stderr + read_logs(job_dir)
    assert f"trained in {work}" in read_logs(job_dir)
    assert (work / "out.txt").read_text() == str(work) and (work / "out.txt").stat().st_uid == person.uid
    # A system directory of the image is not mounted over it: a job submitted from one starts in the image's WORKDIR.
    dry = person.kit(
        "launch",
        "--dry-run",
        "--json",
        "--output-dir",
        str(person.dir / "jobs"),
        "--image",
        str(user_image),
        "--",
        "true",
        cwd=Path("/usr"),
    )
    srun = json.loads(dry.stdout)["srun_argv"]
    assert "--container-workdir=/workspace" in srun and not any(":/usr" in a for a in srun), srun


def test_container_flags_in_the_dry_run(cpu_image, tmp_path):
    proc = kit(
        "launch",
        "--dry-run",
        "--json",
        "--image",
        str(cpu_image),
        "--mount",
        "/tmp:/scratch:ro",
        "--mount",
        "tmpfs:/fast",
        "--container-env",
        "MY_VAR",
        "--env",
        "OTHER=1",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "python",
        "train.py",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    job_dir = out["job_dir"]
    assert not any(a.startswith("--container") for a in out["sbatch_argv"])
    srun = out["srun_argv"]
    mounts = [a for a in srun if a.startswith("--container-mounts=")]
    # Outside git (no snapshot) the job starts in the directory it was submitted from, mounted at its own path.
    assert mounts == [f"--container-mounts={tmp_path}:{tmp_path},{job_dir}:{job_dir},/tmp:/scratch:ro,tmpfs:/fast"]
    # A dry run hashes the image file, copies nothing: the flags name the file given.
    spec = json.loads((Path(job_dir) / "job.json").read_text())
    assert spec["image_source"] == str(cpu_image) and spec["image_digest"].startswith("sha256:")
    assert spec["image"] == str(cpu_image)
    assert f"--container-image={spec['image']}" in srun and f"--container-workdir={tmp_path}" in srun
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
    proc = kit(
        "launch",
        "--dry-run",
        "--json",
        "--image",
        str(cpu_image),
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "python",
        "train.py",
        cwd=repo / "src",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    job_dir, srun = out["job_dir"], out["srun_argv"]
    assert [a for a in srun if a.startswith("--container-mounts=")] == [
        f"--container-mounts={repo}:{repo},{job_dir}:{job_dir}"
    ]
    assert f"--container-workdir={job_dir}/code/src" in srun and f"--chdir={job_dir}/code/src" in out["sbatch_argv"]


@pytest.mark.parametrize("mode", ["create", "squashfuse"])
def test_a_failed_and_a_cancelled_two_node_container_job_leave_nothing(cluster, person, user_image, mode):
    """No process, mount, loop device or container filesystem after a failure and after
    scancel (success: the main job's test), in each of pyxis's modes. The failing rank's own
    code is its task's: the launcher's teardown (in its EXIT trap, after the failed command)
    leaves the runtime's FUSE daemons alone — it once stopped them, and the task died 126
    of its root gone ("Transport endpoint is not connected"). Nothing of the user's is left running (the test
    made them: every process of theirs is its)."""
    skip_where_squashfuse_is_closed(cluster, mode)
    with container_mode(cluster, mode):
        failed_and_cancelled(cluster, person, user_image)
    assert fuse_daemons(person) == []


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
    conf.write_text(
        "".join(f"{line} {setting}\n" if line.startswith("required ") else f"{line}\n" for line in before.splitlines())
    )
    try:
        yield
    finally:
        conf.write_text(before)


# What rank 1's handler finds at /dev/null 1.5 s after the step's signal, in each mode: the image's root is gone
# under squashfuse mode — through enroot's default kernel overlay a path whose dentries pointed into squashfuse
# is stale (real pyxis 0.24 + enroot 4.1.2 here: the same), through fuse-overlayfs (ENROOT_NATIVE_OVERLAYFS=no,
# the stand-in's native_overlayfs=0) every path from "/" fails.
SEEN = {
    "create": "ok",
    "squashfuse": "Stale file handle",
    "squashfuse-fuse-overlayfs": "Transport endpoint is not connected",
}


@pytest.mark.parametrize("mode", list(SEEN))
def test_a_cancelled_container_step_ends_in_seconds_with_every_rank_recorded(cluster, person, user_image, mode):
    """PYXIS.md, squashfuse mode: the step's SIGTERM also reaches the runtime's FUSE daemons, and paths
    through the image's root fail from then on (/dev/null, /proc, the job directory's mount point). The job
    directory is where users keep it, under the image's root (not the container's /tmp tmpfs). Rank 0
    ignores SIGTERM (a rank waiting on a peer that is gone): its launcher kills it after --stop-grace (3 s)
    all the same; rank 1's handler finds the image gone and exits; each launcher records how its rank
    ended, and the cancel ends in seconds, not at KillWait (30 s). Before the launcher kept its descriptors
    and read /proc from its working directory, under fuse-overlayfs: 32.6 s, both exit records empty
    ("cannot redirect standard input from /dev/null": its killer never ran). The job is the ordinary user's, but
    under fuse-overlayfs root's: its daemons, mounted by libfuse, fail every path from "/"; an ordinary user's
    (mounted in their namespace through the step's device) leave the dentries already looked up, the bound /dev
    among them, and the launcher would not meet the end it must survive."""
    skip_where_squashfuse_is_closed(cluster, mode)
    out = Path(tempfile.mkdtemp(prefix="kit-test-", dir="/var/tmp"))
    as_root = mode.endswith("fuse-overlayfs")
    if not as_root:  # root's jobs go in a directory of root's (kit launch refuses another user's)
        person.own(out)
    launch = [
        "launch",
        "--json",
        "--nodes",
        "2",
        "--image",
        str(user_image),
        "--output-dir",
        str(out),
        "--",
        "python3",
        "-c",
        STOPPING,
    ]
    overlay = (
        stand_in_setting(cluster, "native_overlayfs=0") if mode.endswith("fuse-overlayfs") else contextlib.nullcontext()
    )
    try:
        with container_mode(cluster, mode.split("-")[0]), overlay:
            proc = kit(*launch, "--local", cwd=out) if as_root else person.kit(*launch)
            assert proc.returncode == 0, proc.stderr
            job = json.loads(proc.stdout)
            job_dir = Path(job["job_dir"])
            wait_for(lambda: all(f"ready-{r}" in read_logs(job_dir) for r in (0, 1)), 120, what="both ranks ready")
            start = time.time()
            cancel = (
                subprocess.run(["scancel", job["job_id"]], env={**os.environ, **cluster.target.env})
                if as_root
                else person.run(["scancel", job["job_id"]])
            )
            assert cancel.returncode == 0
            assert slurm.wait(cluster.target, job["job_id"], timeout=120).state == "CANCELLED"
        logs = read_logs(job_dir)
        assert "the command did not stop 3 s after the stop signal: killing it" in logs, logs
        records = {r: (job_dir / "logs" / f"exit.r0.rank-{r}").read_text().split() for r in (0, 1)}
        assert {r: words[1:] for r, words in records.items()} == {
            0: ["0", "137", "stopped"],
            1: ["1", "143", "stopped"],
        }, records
        # Each launcher ended seconds after the cancel (the stop grace: 3 s), not at KillWait (30 s); what pyxis
        # does after the tasks (create mode's removal of the unpacked image) is pyxis's.
        took = max(int(words[0]) / 1e9 for words in records.values()) - start
        assert took < 15, f"the ranks ended {took:.1f} s after the cancel (KillWait: 30 s)\n{logs}"
        assert f"rank 1: handler: /dev/null: {SEEN[mode]}" in logs, logs
        assert "cannot redirect" not in logs, logs
        assert_nothing_left(cluster, Waiting(None, job["job_id"], job_dir), 0 if as_root else person.uid)
        wait_for(lambda: fuse_daemons(person) == [], 30, what="the step's FUSE daemons to end with it")
    finally:
        shutil.rmtree(out, ignore_errors=True)


def stray_teardown_lines(logs: str) -> list[str]:
    """A launcher's lines saying its teardown found processes below its task: the command's, or its own
    forks'. The command here leaves none, and kit's own are all stopped before the tree is swept."""
    return [line for line in logs.splitlines() if "left below the task" in line or "own subshell" in line]


def failed_and_cancelled(cluster, person, image):
    loops_before, mounts_before = loops_and_mounts(cluster, person)

    class W:
        def __init__(self, job):
            self.job_id, self.job_dir = job["job_id"], Path(job["job_dir"])

    failed = launched(
        person,
        "--nodes",
        "2",
        "--image",
        str(image),
        command=["bash", "-c", 'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 60'],
    )
    end = slurm.wait(cluster.target, failed["job_id"], timeout=180)
    assert (end.state, end.exit_code) == ("FAILED", 3), read_logs(failed["job_dir"])
    logs = read_logs(failed["job_dir"])
    assert "task 1: Exited with exit code 3" in logs and "Transport endpoint" not in logs, logs
    # Every node holds the runtime's processes below its rank: none is the job's, and each launcher's
    # teardown is its own (a helper signalled as it was forked once ran a second one beside it).
    assert not stray_teardown_lines(logs), logs
    assert_nothing_left(cluster, W(failed), person.uid)
    nothing_of_theirs_left(person)
    cancelled = launched(
        person, "--nodes", "2", "--image", str(image), command=["bash", "-c", 'echo "ready-$RANK"; sleep 300']
    )
    wait_for(
        lambda: all(f"ready-{r}" in read_logs(cancelled["job_dir"]) for r in (0, 1)),
        120,
        what="both ranks in their containers",
    )
    assert person.kit("cancel", cancelled["job_dir"]).returncode == 0
    assert slurm.wait(cluster.target, cancelled["job_id"], timeout=120).state == "CANCELLED"
    assert not stray_teardown_lines(read_logs(cancelled["job_dir"])), read_logs(cancelled["job_dir"])
    assert_nothing_left(cluster, W(cancelled), person.uid)
    nothing_of_theirs_left(person)
    assert released(cluster, person, (loops_before, mounts_before))


def nothing_of_theirs_left(person) -> None:
    """No process of the person's (the test made them: every one is its own) and no mount of their home."""

    def processes() -> str:
        return subprocess.run(["pgrep", "-a", "-u", str(person.uid)], capture_output=True, text=True).stdout

    wait_for(lambda: processes() == "", 30, what=f"no process of {person.name} left")
    assert person.entry.pw_dir not in Path("/proc/self/mountinfo").read_text()


def srun(person, *args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """srun straight on the local cluster, as the person: the container plugin alone, without kit's scripts."""
    return person.run(["srun", "-N1", *args], env=env, timeout=timeout)


PROBE = 'echo "pwd=$(pwd) shell=${SHELL-unset} term=${TERM-unset} path=$PATH home=$HOME user=$USER"'


def test_login_environment_and_default_workdir_follow_pyxis(cluster, person, user_image, base_image):
    """PYXIS.md, "Inside the container": the login variables (HOME, USER, SHELL, a
    default PATH) win over the task's, /etc/environment wins over them, and names in
    --container-env keep the task's value; the working directory is the image's WORKDIR
    (from /etc/rc), or HOME for an image without /etc/rc. Values as enroot sets them for an ordinary user: its
    10-shadow.sh hook puts the user's host entry in the image's passwd and makes their home there (the stand-in
    left USER and HOME as the task had them, and an image without /etc/rc started them in root's /root); PATH from
    the image's login.defs ENV_PATH (ENV_SUPATH is root's); TERM from its environ.d (TERM=${TERM}): the task's
    own, empty when the task has none."""
    task = {"TERM": "xterm", "SHELL": "/bin/zsh", "PATH": "/usr/bin:/bin:/host/only", "HOME": "/home/alice"}
    home, name = person.entry.pw_dir, person.name
    proc = srun(person, f"--container-image={base_image}", "bash", "-c", PROBE, env=task)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        f"pwd={home}",
        "shell=/bin/bash",
        "term=xterm",
        "path=/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games",
        f"home={home}",
        f"user={name}",
    ], proc.stdout
    # Who they are in the image: its passwd names them (whoami, getpass and ssh read it), their home theirs.
    proc = srun(
        person,
        f"--container-image={base_image}",
        "bash",
        "-c",
        'echo "$(whoami) $(id -gn) $(stat -c %U:%a ~) $(ls -A ~ | sort | tr "\n" " ")"',
    )
    assert proc.stdout.split() == [name, name, f"{name}:755", ".bash_logout", ".bashrc", ".profile"], (
        proc.stdout + proc.stderr
    )
    proc = person.run(
        [
            "env",
            "-u",
            "TERM",
            "srun",
            "-N1",
            f"--container-image={base_image}",
            "bash",
            "-c",
            'echo "term=[${TERM-unset}]"',
        ],
        timeout=180,
    )
    assert proc.stdout.strip() == "term=[]", proc.stdout + proc.stderr
    # /sys read-only; the host's /etc/hostname and /etc/machine-id (PYXIS.md, "Mounts inside").
    look = (
        "touch /sys/kit-probe 2>/dev/null && echo sys-writable || echo sys-ro; cat /etc/hostname; "
        'cat /etc/machine-id 2>/dev/null || echo no-machine-id; stat -c "tmp=%a" /tmp'
    )
    proc = srun(person, f"--container-image={base_image}", "bash", "-c", look)
    host = [
        Path("/etc/hostname").read_text().strip() if Path("/etc/hostname").exists() else "",
        Path("/etc/machine-id").read_text().strip() if Path("/etc/machine-id").exists() else "no-machine-id",
    ]
    # /tmp is a tmpfs of mode 0755, as enroot 4.1.2 makes it, not 1777.
    assert proc.stdout.split("\n")[:4] == ["sys-ro", *host, "tmp=755"], proc.stdout + proc.stderr
    # The cpu image: WORKDIR /workspace through its /etc/rc; TERM listed in --container-env keeps the task's
    # value. Its ENV PATH is in /etc/environment, but enroot starts the image's login shell, and Debian's
    # /etc/profile sets PATH by uid: an ordinary user's is ENV_PATH's (real pyxis 0.24 + enroot 4.1.2; as root
    # the two are the same string, and the stand-in's "/etc/environment wins" went unseen until a user ran it).
    proc = srun(person, f"--container-image={user_image}", "--container-env=TERM", "bash", "-c", PROBE, env=task)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        "pwd=/workspace",
        "shell=/bin/bash",
        "term=xterm",
        "path=/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games",
        f"home={home}",
        f"user={name}",
    ], proc.stdout


def test_tasks_of_a_node_share_one_container(cluster, person, user_image):
    """PYXIS.md: one container per node per step, shared by that node's tasks (a shared
    /tmp, and with --container-writable a shared root filesystem)."""
    loops_before, mounts_before = loops_and_mounts(cluster, person)
    share = (
        'if [ "$SLURM_PROCID" = 0 ]; then echo from-0 > /tmp/shared; echo from-0 > /var/tmp/shared; fi; '
        "for i in $(seq 100); do [ -e /tmp/shared ] && [ -e /var/tmp/shared ] && break; sleep 0.1; done; "
        'echo "task $SLURM_PROCID sees $(cat /tmp/shared /var/tmp/shared 2>/dev/null | tr "\\n" " ")"'
    )
    proc = srun(person, "-n2", f"--container-image={user_image}", "--container-writable", "bash", "-c", share)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["task 0 sees from-0 from-0 ", "task 1 sees from-0 from-0 "], proc.stdout
    # The container lived in the step's own mount namespace: nothing of it is left.
    assert released(cluster, person, (loops_before, mounts_before))


def test_a_named_container_persists_on_its_node_with_its_writes(cluster, person, base_image):
    """PYXIS.md: --container-name keeps the container (pyxis_NAME) in the node's data path
    after the job, with its writes when writable; a later job with the name reuses it
    ("pyxis: reusing existing container filesystem"), even when given another image."""
    name = f"kit-test-{os.getpid()}"
    kept = named_containers(cluster, "node1", person.uid) / f"pyxis_{name}"
    try:
        with container_scope(cluster, "global"):
            _persist_and_reuse(cluster, person, base_image, name, kept)
    finally:
        # What `kit cluster down` does for every node (tests/test_cluster.py checks it).
        subprocess.run(["rm", "-rf", str(kept)], check=True)


def _persist_and_reuse(cluster, person, base_image, name: str, kept: Path) -> None:
    """The named container's life in pyxis's global scope (see the test above)."""
    first = srun(
        person,
        "-w",
        "node1",
        f"--container-image={base_image}",
        f"--container-name={name}",
        "--container-writable",
        "bash",
        "-c",
        "echo written-by-the-first > /var/tmp/note; cat /etc/debian_version",
    )
    assert first.returncode == 0, first.stderr
    assert (kept / "var" / "tmp" / "note").read_text() == "written-by-the-first\n"
    second = srun(person, "-w", "node1", f"--container-name={name}", "cat", "/var/tmp/note")
    assert second.returncode == 0, second.stderr
    assert second.stdout == "written-by-the-first\n"
    # pyxis says so in the slurmd log, not on srun's stderr (PYXIS.md).
    log = (cluster.root / "log" / "slurmd-node1.log").read_text(errors="replace")
    assert "pyxis: reusing existing container filesystem" in log
    assert "reusing existing container filesystem" not in second.stderr, second.stderr
    # Read-only unless --container-writable, also when reused.
    third = srun(person, "-w", "node1", f"--container-name={name}", "bash", "-c", "touch /var/tmp/x || echo refused")
    assert third.stdout.strip().endswith("refused"), third.stdout + third.stderr
    # Another node has no such container and no image was given: a clear error, exit 1.
    missing = srun(person, "-w", "node2", f"--container-name={name}", "true")
    assert missing.returncode == 1 and "pyxis" in missing.stderr, missing.stderr
    if cluster.state().containers == "kit-pyxis":  # the stand-in's own words
        assert f"pyxis: error: no container named {name} on this node" in missing.stderr, missing.stderr


def test_under_container_scope_job_kit_names_the_container_and_the_job_epilog_removes_it(cluster, person, base_image):
    """pyxis's container_scope=job in create mode: kit names the container (pyxis_JOBID_kit on each node, as
    pyxis names a job's), so that the job epilog, not the step, removes it: the job ends COMPLETED, its
    containers are there while it runs and gone after, on every node, and the nodes stay up. A name the user
    gives is theirs; in pyxis's global scope kit names nothing."""
    from kit.slurm import pyxis

    data = [named_containers(cluster, f"node{i}", person.uid) for i in (1, 2)]
    with container_scope(cluster, "global"):  # pyxis's default: named containers stay
        assert not pyxis.epilog_removes(slurm.pyxis_settings(cluster.target))
    with container_scope(cluster, "job"):
        assert slurm.pyxis_settings(cluster.target)["container_scope"] == "job"
        job = launched(
            person,
            "--nodes",
            "2",
            "--image",
            str(base_image),
            "--no-exporter",
            command=["bash", "-c", "sleep 4; echo ran in $(cat /etc/debian_version)"],
        )
        job_dir, job_id = Path(job["job_dir"]), job["job_id"]
        assert "--container-name=kit" in (job_dir / "job.env").read_text()
        kept = [d / f"pyxis_{job_id}_kit" for d in data]
        wait_for(lambda: all(k.is_dir() for k in kept), 120, what="the job's named container on both nodes")
        end = slurm.wait(cluster.target, job_id, timeout=180)
        assert (end.state, end.exit_code) == ("COMPLETED", 0), read_logs(job_dir)
        assert "ran in 12." in read_logs(job_dir)
        wait_for(lambda: not any(k.exists() for k in kept), 30, what="the job epilog removing its containers")
        assert not [p.name for d in data for p in d.iterdir() if p.name.startswith(f"pyxis_{job_id}")]
        mine = launched(person, "--image", str(base_image), "--container-name", "mine", "--dry-run", command=["true"])
        assert (
            "--container-name=mine" in " ".join(mine["sbatch_argv"])
            or "--container-name=mine" in (Path(mine["job_dir"]) / "job.env").read_text()
        )
    nodes = subprocess.run(
        ["sinfo", "-h", "-o", "%t"], env={**os.environ, **cluster.target.env}, capture_output=True, text=True
    ).stdout.split()
    assert set(nodes) == {"idle"}, nodes


# Run 0 writes into the container's own filesystem, reports progress once and hangs (no rank named: no Python); the
# run restarted in the allocation says whether it finds the file: the same container, or a fresh one.
KEPT = """
mark=/var/tmp/kit-run-0-was-here
if [[ "$KIT_RESTART" == 0 ]]; then
  echo "rank $RANK" >"$mark"; echo "step 1" >"$KIT_PROGRESS_FILE"; sleep 300
fi
echo "run $KIT_RESTART found: $(cat "$mark" 2>/dev/null || echo nothing)"
"""


@pytest.mark.parametrize("mode", ["create", "squashfuse"])
def test_a_run_restarted_in_the_allocation_keeps_the_jobs_container(cluster, person, base_image, mode):
    """Under container_scope=job a hang's next run starts in the allocation (2 nodes, none to spare), as the
    ordinary user, and the job ends COMPLETED 0. In create mode kit names the job's container: the next run
    is in the same container on each node (what run 0 wrote there is there) and the job epilog removes it.
    In squashfuse mode kit names none (pyxis starts an unnamed container from the image itself: nothing to
    unpack or keep): the stopped step's FUSE daemons go with it, the next run mounts the image afresh (run
    0's writes are not there) and no daemon is left."""
    skip_where_squashfuse_is_closed(cluster, mode)
    data = [named_containers(cluster, f"node{i}", person.uid) for i in (1, 2)]
    slurmd_log = cluster.root / "log" / "slurmd-node2.log"
    slurmd_log_at = slurmd_log.stat().st_size
    with container_scope(cluster, "job"), container_mode(cluster, mode):
        job = launched(
            person,
            *("--nodes", "2", "--image", str(base_image), "--no-exporter", "--hang-timeout", "3"),
            *("--max-restarts", "1", "--container-writable"),
            command=["bash", "-c", KEPT],
        )
        job_dir, job_id = Path(job["job_dir"]), job["job_id"]
        end = slurm.wait(cluster.target, job_id, timeout=180)
        logs = read_logs(job_dir)
        assert (end.state, end.exit_code) == ("COMPLETED", 0), logs
        runs = [json.loads(line) for line in (job_dir / "runs.jsonl").read_text().splitlines()]
        assert [(r["end"], r.get("then")) for r in runs] == [("hang", "restart"), ("finished", None)], runs
        found = {"create": ("rank 0", "rank 1"), "squashfuse": ("nothing", "nothing")}[mode]
        assert f"0: run 1 found: {found[0]}" in logs and f"1: run 1 found: {found[1]}" in logs, logs
        wait_for(lambda: not any((d / f"pyxis_{job_id}_kit").exists() for d in data), 30, what="the job epilog")
        wait_for(lambda: fuse_daemons(person) == [], 30, what="the steps' FUSE daemons to end")
    with open(slurmd_log, errors="replace") as f:
        f.seek(slurmd_log_at)
        direct = f.read().count("skipping container creation (squashfuse enabled)")
    assert direct == {"create": 0, "squashfuse": 2}[mode]  # each run's step on node2, started from the image


def test_a_node_repaired_from_a_shell_with_another_path_still_runs_containers(cluster, person, base_image):
    """node2's slurmd dies; `kit cluster up` (root's) repairs it from a shell whose
    PATH lacks enroot's directory (nothing under /usr/local: enroot built from source lives
    there) and Slurm's own tools are found by kit; the user's container jobs on both nodes
    still run (real pyxis: the per-node enroot wrapper puts enroot's helpers on PATH itself)."""
    import signal

    from kit.cluster.processes import alive as _alive

    st = cluster.state()
    os.kill(st.pids["node2"], signal.SIGKILL)
    wait_for(lambda: not _alive(st.pids["node2"], "slurmd"), 10, what="node2's slurmd to die")
    bare = f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin"
    env = {"PATH": bare, "KIT_HOME": os.environ["KIT_HOME"], "HOME": os.environ.get("HOME", "/root")}
    up = subprocess.run(
        [sys.executable, "-m", "kit", "cluster", "up"], env=env, capture_output=True, text=True, timeout=120
    )
    assert up.returncode == 0, up.stdout + up.stderr
    assert "restarting node2" in up.stderr + up.stdout
    assert cluster.running() and cluster.state().pids["node2"] != st.pids["node2"]
    proc = person.kit(
        "launch",
        "--nodes",
        "2",
        "--wait",
        "--image",
        str(base_image),
        "--output-dir",
        str(person.dir / "jobs"),
        "--",
        "bash",
        "-c",
        'echo "in $(. /etc/os-release; echo $ID) on $SLURMD_NODENAME"',
        timeout=300,
    )
    job_dir = job_dir_of(proc)
    assert proc.returncode == 0, proc.stderr + read_logs(job_dir)
    assert sorted(re.findall(r"^\d: in debian on (node\d)$", read_logs(job_dir), re.M)) == ["node1", "node2"]


def test_bench_container_quick(cluster, cpu_image, tmp_path):
    """bench/bench_container.py --quick runs: one pair of 10-step jobs."""
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_container.py"),
            "--quick",
            "--image",
            str(cpu_image),
            "--output-dir",
            str(tmp_path / "jobs"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "first step, squashfuse / create:" in proc.stdout
        and "create mode's end of the job beyond the host's" in proc.stdout
    ), proc.stdout


def test_container_options_on_sbatch_and_salloc_follow_pyxis(cluster, person, user_image):
    """PYXIS.md: pyxis takes its flags on sbatch (the batch script itself runs in the image,
    its script bound in from slurmd's spool directory) and on salloc (the allocation's steps
    inherit them). kit puts them on the srun step; a user's own sbatch line may not."""
    out = person.dir / "batch.out"
    sub = person.run(
        [
            "sbatch",
            "--parsable",
            "-N1",
            f"--container-image={user_image}",
            f"--output={out}",
            "--wrap",
            'test -e /.kit/image.json && echo "batch inside the image"',
        ],
        timeout=60,
    )
    assert sub.returncode == 0, sub.stderr
    end = slurm.wait(cluster.target, sub.stdout.strip().split(";")[0], timeout=180)
    assert end.state == "COMPLETED", out.read_text() if out.exists() else end
    assert out.read_text().strip() == "batch inside the image", out.read_text()
    alloc = person.run(
        [
            "salloc",
            "-N1",
            f"--container-image={user_image}",
            "srun",
            "bash",
            "-c",
            'test -e /.kit/image.json && echo "step inside the image"',
        ],
        timeout=180,
    )
    assert alloc.returncode == 0 and alloc.stdout.strip() == "step inside the image", alloc.stdout + alloc.stderr


FUNCTIONS = """
import json, sys
import kit

def where_am_i(tag):
    import os
    import sys

    return {"tag": tag, "rank": int(os.environ["RANK"]), "uid": os.getuid(), "python": sys.executable,
            "kit_runtime": os.path.isdir("/opt/kit/python")}

def square(x):
    return x * x

image = sys.argv[1]
job = kit.submit(where_am_i, "img", nodes=2, image=image, no_exporter=True, output_dir="jobs")
tasks = kit.map(square, [1, 2, 3], image=image, no_exporter=True, output_dir="jobs")
print(json.dumps({"submit": job.results(timeout=600), "map": [t.result(timeout=600) for t in tasks]}))
"""


def test_a_function_job_runs_in_a_kit_built_image(cluster, person, user_image):
    """Under an image, from the user's venv's Python: the call is unpickled by the image's python3 (same
    minor version, cloudpickle built in: checked from the image's file list before submitting), on each rank
    as them; kit.map's tasks likewise."""
    (person.dir / "functions.py").write_text(FUNCTIONS)
    person.own(person.dir / "functions.py")
    calls = person.run(["python3", "functions.py", str(user_image)], timeout=900)
    assert calls.returncode == 0, calls.stderr
    got = json.loads(calls.stdout.splitlines()[-1])
    results = got["submit"]
    assert [r["rank"] for r in results] == [0, 1] and {r["tag"] for r in results} == {"img"}
    assert {r["uid"] for r in results} == {person.uid}
    assert {r["python"] for r in results} == {"/usr/bin/python3"} != {f"{person.entry.pw_dir}/venv/bin/python3"}
    assert {r["kit_runtime"] for r in results} == {True} and not Path("/opt/kit/python").exists()  # in the image
    assert got["map"] == [1, 4, 9], got


def _git(repo: Path, *args: str, person=None) -> str:
    """git in ``repo``, as ``person`` where the repository is theirs (git refuses another owner's)."""
    argv = ["git", "-C", str(repo), "-c", "user.email=t@kit", "-c", "user.name=t", *args]
    proc = person.run(argv) if person else subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _image_with_marker(debian_base: Path, out: Path, marker: str) -> None:
    subprocess.run(
        [
            "mksquashfs",
            str(debian_base),
            str(out),
            "-noappend",
            "-quiet",
            "-no-progress",
            "-comp",
            "lz4",
            "-p",
            f"etc/kit-test-image f 444 0 0 echo {marker}",
            *NO_DEVICES,
        ],
        check=True,
        timeout=600,
    )


def test_a_held_job_runs_the_code_and_image_it_was_submitted_with(cluster, debian_base, person):
    """A job held in the queue while its script is edited, its
    ignored data changed and its image file rebuilt in place runs the submitted script and
    image (by content) and the data as it is now; so does its requeued run, after another
    edit and a commit; job.json names the commit, the tree's cleanliness, the snapshot and the
    image digests; kit rerun of it runs the same snapshot and image again."""
    import hashlib

    repo = person.dir / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / ".gitignore").write_text("data/\n")
    script = (
        'echo "code=%s image=$(cat /etc/kit-test-image) data=$(cat data/input.txt) run=$KIT_RESTART"; '
        'if [ -e data/hold ]; then trap "exit 0" TERM; echo ready; sleep 300 & wait; fi\n'
    )
    (repo / "run.sh").write_text(script % "v1")
    (repo / "data" / "input.txt").write_text("data-1\n")
    (repo / "data" / "hold").write_text("")
    image = person.dir / "img.sqsh"
    _image_with_marker(debian_base, image, "A")
    person.own(repo, image)
    _git(repo, "init", "-q", person=person)
    _git(repo, "add", "run.sh", ".gitignore", person=person)
    _git(repo, "commit", "-qm", "v1", person=person)
    commit = _git(repo, "rev-parse", "HEAD", person=person)
    digest_a = "sha256:" + hashlib.sha256(image.read_bytes()).hexdigest()

    proc = person.kit(
        "launch",
        "--image",
        str(image),
        "--no-exporter",
        "--heartbeat",
        "0",
        "--sbatch-arg=--hold",
        "--output-dir",
        str(person.dir / "jobs"),
        "--",
        "bash",
        "run.sh",
        cwd=repo,
    )
    assert proc.returncode == 0, proc.stderr
    job_id = re.search(r"^Submitted job (\d+)$", proc.stdout, re.M).group(1)
    job_dir = Path(job_dir_of(proc))
    assert slurm.job_status(cluster.target, job_id).state == "PENDING"
    # While it waits: the script edited, the data changed, the image file rebuilt in place.
    (repo / "run.sh").write_text(script % "v2")
    (repo / "data" / "input.txt").write_text("data-2\n")
    small = person.dir / "b-root" / "etc"
    small.mkdir(parents=True)
    (small / "kit-test-image").write_text("B\n")
    subprocess.run(["mksquashfs", str(small.parent), str(image), "-noappend", "-quiet", "-no-progress"], check=True)
    assert person.run(["scontrol", "release", job_id]).returncode == 0  # their own hold, theirs to release

    wait_for(lambda: "0: ready" in read_logs(job_dir), 240, what="the first run to start")
    assert "0: code=v1 image=A data=data-2 run=0" in read_logs(job_dir)
    # Edited and committed again; they requeue it: the requeued run runs the snapshot too.
    (repo / "run.sh").write_text(script % "v3")
    _git(repo, "commit", "-qam", "v3", person=person)
    (repo / "data" / "hold").unlink()
    assert person.run(["scontrol", "requeue", job_id]).returncode == 0
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
    proc = person.kit("rerun", str(job_dir), "--edit", "sbatch_args=[]", "--wait", timeout=300)
    assert proc.returncode == 0, proc.stderr
    again = Path(job_dir_of(proc))
    respec = json.loads((again / "job.json").read_text())
    assert respec.pop("sbatch_args") == [] and spec.pop("sbatch_args") == ["--hold"]
    assert respec == spec, (respec, spec)
    assert "0: code=v1 image=A data=data-2 run=0" in read_logs(again)
    assert (again / "FINISHED").exists()
