"""The local cluster serves every local user, as a site does: an ordinary user (created here, removed
after, with everything they own) with kit installed as a login node's user has it — a venv of Debian's
Python (`python3` here is root's, under /root, which no other user can run), kit's login-side
dependencies only — reaches root's cluster through what `kit cluster env` prints, and runs Slurm's
commands, `kit launch`, a sweep, `kit ps`, `kit logs` and `sacct` there; their jobs run as their own uid.
What is root's stays root's: the munge key, slurmdbd's configuration, the database, the cluster's state."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, as_user, container_mode, named_containers, read_logs, wait_for

from kit.cluster import accounting, public

pytestmark = pytest.mark.cluster


def test_what_is_roots_stays_roots(cluster, user):
    """The client side is every user's (slurm.conf, the plugin stack, munged's socket, the spool); the munge
    key, slurmdbd's configuration, the database and the cluster's own directory are root's alone."""
    assert cluster.public.parent == public.MACHINE and cluster.conf.parent == cluster.public
    for path in (cluster.conf, cluster.public / "plugstack.conf"):
        assert os.stat(path).st_mode & 0o777 == 0o644, path
    secret = [cluster.root / "munge" / "munge.key", cluster.public / "slurmdbd.conf", accounting.directory(cluster.root),
              cluster.root / "state", cluster.root]
    for path in secret:
        st = os.stat(path)
        assert st.st_uid == 0 and not st.st_mode & 0o077, (path, oct(st.st_mode))
    proc = as_user(user, " ; ".join(f"{'ls' if p.is_dir() else 'cat'} {p} >/dev/null 2>&1 || echo refused"
                                    for p in secret))
    assert proc.stdout.split() == ["refused"] * len(secret), proc.stdout + proc.stderr


def test_an_ordinary_user_runs_slurm_and_kit_on_roots_cluster(cluster, user):
    """`kit cluster env` (theirs: root's cluster, found where every user reads; `kit cluster status` names it), then
    Slurm's own commands and kit's, as that user: each job runs as their uid, kit ps, kit logs and sacct see it."""
    env = as_user(user, "kit cluster env")
    assert env.returncode == 0 and env.stdout.splitlines() == public.login_lines(cluster.conf, False), env
    status = as_user(user, "kit cluster status")  # theirs is not running; root's is named, with how to use it
    assert status.returncode == 1 and status.stdout.splitlines()[1] == (
        f"this machine's local cluster (root's, every local user's): SLURM_CONF={public.clusters()[0]}; use it "
        'with: eval "$(kit cluster env)"'), status.stdout
    conf = f"; export SLURM_CONF={cluster.conf}"  # a site's login shell has it; the newest of several is ours
    slurm = as_user(user, "sinfo -h -o %D && sbatch --wait -N2 -o slurm.out --wrap 'srun -l id -u' && sort slurm.out",
                    env=conf)
    uid = user.pw_uid
    assert slurm.returncode == 0 and slurm.stdout.split()[0] == "2", slurm.stdout + slurm.stderr
    assert slurm.stdout.splitlines()[-2:] == [f"0: {uid}", f"1: {uid}"], slurm.stdout

    launched = as_user(user, "kit launch --nodes 2 --wait --no-exporter --json -- bash -c 'echo rank $RANK uid $(id -u)'",
                       env=conf)
    assert launched.returncode == 0, launched.stderr
    job = json.loads(launched.stdout.splitlines()[0])
    assert Path(job["job_dir"]).is_relative_to(user.pw_dir) and os.stat(job["job_dir"]).st_uid == uid
    logs = as_user(user, f"kit logs {job['job_id']}", env=conf)
    assert sorted(logs.stdout.splitlines()) == [f"0: rank 0 uid {uid}", f"1: rank 1 uid {uid}"], logs.stdout + logs.stderr
    sweep = as_user(user, "kit launch --sweep LR=0.1,0.2 --wait --no-exporter -- bash -c 'echo lr $LR'", env=conf)
    assert sweep.returncode == 0, sweep.stderr
    ps = as_user(user, "kit ps --json", env=conf)
    rows = json.loads(ps.stdout)
    assert {r["id"]: r["state"] for r in rows}[str(job["job_id"])] == "COMPLETED", rows
    assert len([r for r in rows if "_" in r["id"] and r["state"] == "COMPLETED"]) == 2, rows
    accounted = as_user(user, f"sacct -n -X -j {job['job_id']} -o state,user%20", env=conf)
    assert accounted.stdout.split() == ["COMPLETED", user.pw_name], accounted.stdout + accounted.stderr


@pytest.fixture(scope="module")
def user_image(user, cpu_image) -> Path:
    """kit's image, the user's copy (in their home, theirs)."""
    image = Path(user.pw_dir) / "cpu-lightning.sqsh"
    shutil.copyfile(cpu_image, image)
    os.chown(image, user.pw_uid, user.pw_gid)
    return image


@pytest.mark.parametrize("mode", ["create", "squashfuse"])
def test_an_ordinary_users_main_job_runs_in_kits_image(cluster, user, user_image, mode):
    """The README's main job as an ordinary user in each of pyxis's modes: 2 nodes in kit's image (the stand-in
    enters it through a user namespace of the task's own, as enroot does for an unprivileged user: it ran chroot
    after Slurm had dropped root, and failed; in squashfuse mode the node's first task mounts the image in that
    namespace through its FUSE daemons, and its other tasks join it), its ranks the user's uid on the host, then
    `kit report`. Then a failed and a cancelled 2-node job of theirs in the image: each ends in its true state,
    and nothing of the user's is left running (their FUSE daemons included) nor mounted."""
    if mode == "squashfuse" and cluster.state().containers == "pyxis" and os.stat("/dev/fuse").st_mode & 0o006 != 0o006:
        pytest.skip("real enroot opens /dev/fuse as the job's user, for whom this machine's is closed (Debian's is "
                    "0666): real pyxis cannot start squashfuse mode for an ordinary user here")
    with container_mode(cluster, mode):
        main_job_as(cluster, user, user_image, mode)
        failed_and_cancelled_as(cluster, user, user_image)


def failed_and_cancelled_as(cluster, user, image):
    conf = f"; export SLURM_CONF={cluster.conf}"
    failed = as_user(user, f"kit launch --nodes 2 --image {image} --wait --json --no-exporter -- bash -c "
                           "'if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 60'", env=conf, timeout=300)
    job_dir = json.loads(failed.stdout.splitlines()[0])["job_dir"]
    assert failed.returncode == 3 and "FAILED" in failed.stderr, failed.stderr + read_logs(job_dir)
    nothing_of_theirs_left(user)
    running = as_user(user, f"kit launch --nodes 2 --image {image} --json --no-exporter -- bash -c "
                            "'echo \"ready-$RANK\"; sleep 300'", env=conf, timeout=120)
    assert running.returncode == 0, running.stderr
    job = json.loads(running.stdout.splitlines()[0])
    wait_for(lambda: all(f"ready-{r}" in read_logs(job["job_dir"]) for r in (0, 1)), 120, what="both ranks ready")
    cancel = as_user(user, f"kit cancel {job['job_id']}", env=conf)
    assert cancel.returncode == 0, cancel.stderr

    def state() -> str:
        rows = json.loads(as_user(user, "kit ps --json", env=conf).stdout)
        return {r["id"]: r["state"] for r in rows}.get(str(job["job_id"]), "")
    wait_for(lambda: state() == "CANCELLED", 120, poll=1, what="the cancelled job's end")
    nothing_of_theirs_left(user)


def nothing_of_theirs_left(user) -> None:
    """No process of the user's (the test made the user: every one is its own) and no mount of theirs."""
    def processes() -> str:
        return subprocess.run(["pgrep", "-a", "-u", str(user.pw_uid)], capture_output=True, text=True).stdout
    wait_for(lambda: processes() == "", 30, what=f"no process of {user.pw_name} left")
    assert user.pw_dir not in Path("/proc/self/mountinfo").read_text()


def main_job_as(cluster, user, user_image, mode):
    image = user_image
    conf = f"; export SLURM_CONF={cluster.conf}"
    job = as_user(user, f"kit launch --nodes 2 --image {image} --wait --json -- bash -c 'echo uid $(id -u) in "
                        f"$(cat /etc/debian_version) && exec python3 -m kit.train --max-steps 30 --step-delay 0.02'",
                  env=conf, timeout=600)
    job_dir = json.loads(job.stdout.splitlines()[0])["job_dir"]
    assert job.returncode == 0, job.stderr + read_logs(job_dir)
    logs = as_user(user, f"kit logs {job_dir}", env=conf).stdout
    assert [line for line in logs.splitlines() if " uid " in line] and all(
        f"uid {user.pw_uid} in 12." in line for line in logs.splitlines() if " uid " in line), logs
    assert (Path(job_dir) / "FINISHED").exists()
    report = as_user(user, f"kit report {job_dir}", env=conf, timeout=300)
    assert report.returncode == 0 and report.stdout.startswith("job "), report.stdout + report.stderr
    assert f"container: {mode} mode (" in report.stdout, report.stdout


FUNCTIONS = """
import json, os, sys
import kit

def where(tag):
    import os
    return [tag, int(os.environ["RANK"]), os.getuid()]

def square(x):
    return x * x

image = sys.argv[1]
job = kit.submit(where, "f", nodes=2, image=image, no_exporter=True)
tasks = kit.map(square, [1, 2, 3], image=image, no_exporter=True)
print(json.dumps({"submit": job.results(timeout=600), "map": [t.result(timeout=600) for t in tasks]}))
"""


def test_an_ordinary_users_torchrun_and_function_jobs_run_in_kits_image(cluster, user, user_image):
    """As the user, in kit's image: the README's torchrun example (one world of 4 on 2 nodes, their examples
    mounted), then kit.submit (2 ranks) and kit.map (3 tasks) from their venv's Python, each call run as them."""
    examples = Path(user.pw_dir) / "examples"
    shutil.copytree(REPO / "launch" / "examples", examples)
    script = Path(user.pw_dir) / "functions.py"
    script.write_text(FUNCTIONS)
    for path in (examples, *examples.iterdir(), script):
        os.chown(path, user.pw_uid, user.pw_gid)
    conf = f"; export SLURM_CONF={cluster.conf}"
    torchrun = as_user(user, f"kit launch --nodes 2 --ntasks-per-node 1 --image {user_image} --wait --no-exporter "
                             f"--mount {examples}:/examples -- torchrun --nproc-per-node 2 /examples/fsdp2.py",
                       env=conf, timeout=600)
    assert torchrun.returncode == 0, torchrun.stderr
    logs = as_user(user, f"kit logs {torchrun.stdout.split()[2]}", env=conf).stdout
    assert "world=4" in logs and "fsdp2 done" in logs, logs
    calls = as_user(user, f"python3 functions.py {user_image}", env=conf, timeout=900)
    assert calls.returncode == 0, calls.stderr
    got = json.loads(calls.stdout.splitlines()[-1])
    assert got == {"submit": [["f", 0, user.pw_uid], ["f", 1, user.pw_uid]], "map": [1, 4, 9]}, got


ENV_PROBE = ('echo "lang=${LANG-unset} language=${LANGUAGE-unset} lc_all=${LC_ALL-unset} user=${USER-unset} '
             'logname=${LOGNAME-unset} home=${HOME-unset} uid=$(id -u)"\n'
             'grep " /data " /proc/self/mountinfo | cut -d" " -f6\n'
             '/data/tool.sh || echo "exec refused"; touch /data/x 2>/dev/null || echo "write refused"\n')


def test_an_ordinary_users_environment_and_mount_flags_follow_pyxis(cluster, user, user_image):
    """As test_containers' root case, for an ordinary user (the same lines from real pyxis 0.24 + enroot 4.1.2 and
    the stand-in, seen side by side): LANGUAGE dropped, LANG the image's, LC_ALL kept through --env (kit's
    --container-env), USER, LOGNAME and HOME the user's; ro+nosuid+noexec on their mount honoured."""
    host = Path(user.pw_dir) / "probe-host"
    host.mkdir(exist_ok=True)
    (host / "tool.sh").write_text("#!/bin/sh\necho ran\n")
    (host / "tool.sh").chmod(0o755)
    (host / "probe.sh").write_text(ENV_PROBE)
    for path in (host, *host.iterdir()):
        os.chown(path, user.pw_uid, user.pw_gid)
    conf = f"; export SLURM_CONF={cluster.conf} LANG=en_US.UTF-8 LANGUAGE=en"
    job = as_user(user, f"kit launch --wait --json --no-exporter --image {user_image} --env LC_ALL=C "
                        f"--mount {host}:/data:ro+nosuid+noexec -- bash /data/probe.sh", env=conf, timeout=300)
    job_dir = json.loads(job.stdout.splitlines()[0])["job_dir"]
    assert job.returncode == 0, job.stderr + read_logs(job_dir)
    out = (Path(job_dir) / "logs" / "rank-0.r0.log").read_text().splitlines()
    name = user.pw_name
    assert out[0] == (f"lang=C.UTF-8 language=unset lc_all=C user={name} logname={name} home={user.pw_dir} "
                      f"uid={user.pw_uid}"), out
    assert set(out[1].split(",")) >= {"ro", "nosuid", "noexec"}, out
    assert "exec refused" in out and "write refused" in out and "ran" not in out, out


@pytest.mark.parametrize("mode", ["create", "squashfuse"])
def test_a_container_mounts_only_what_its_user_can_reach(cluster, user, user_image, tmp_path, mode):
    """--container-mounts opens each source as the job's user, as enroot does in their namespace: the stand-in
    resolved the paths as slurmstepd's root, so a file readable by all behind a directory closed to the user
    (another user's job directory under their 0700 home) was theirs to read through a mount. Theirs mounts."""
    if mode == "squashfuse" and cluster.state().containers == "pyxis" and os.stat("/dev/fuse").st_mode & 0o006 != 0o006:
        pytest.skip("real pyxis cannot start squashfuse mode for an ordinary user here (see the main job's test)")
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    (closed / "secret").write_text("not theirs\n")
    (closed / "secret").chmod(0o644)
    own = Path(user.pw_dir) / "own.txt"
    own.write_text("theirs\n")
    os.chown(own, user.pw_uid, user.pw_gid)
    conf = f"; export SLURM_CONF={cluster.conf}"
    srun = f"srun -N1 --container-image={user_image} --container-workdir=/tmp"
    with container_mode(cluster, mode):
        refused = as_user(user, f"{srun} --container-mounts={closed}/secret:/x cat /x", env=conf, timeout=180)
        assert refused.returncode != 0 and "not theirs" not in refused.stdout, refused.stdout + refused.stderr
        # The stand-in: "Permission denied"; enroot 4.1.2: "enroot-mount: failed to mount: … No such file or directory"
        assert "Permission denied" in refused.stderr or "failed to mount" in refused.stderr, refused.stderr
        mounted = as_user(user, f"{srun} --container-mounts={own}:/x cat /x", env=conf, timeout=180)
        assert (mounted.returncode, mounted.stdout) == (0, "theirs\n"), mounted.stderr


def test_a_named_container_is_its_users_own(cluster, user, user_image):
    """--container-name (pyxis's global scope: kept on the node after the job) names the user's own container, as
    enroot's data path is each user's: the stand-in kept the node's names in one directory, so an ordinary user's
    `--container-name N` entered root's container N, writes and all. Root keeps N with a note in it; the user's N
    is another container: without an image there is none; with one it is theirs, their writes kept for their next
    step; root's N still holds root's note."""
    assert cluster.state().container_scope == "global"
    name, note = f"kit-test-{os.getpid()}", "/var/tmp/kit-note"
    roots, theirs = (named_containers(cluster, "node1", uid) / f"pyxis_{name}" for uid in (0, user.pw_uid))
    conf = f"; export SLURM_CONF={cluster.conf}"
    srun = f"srun -N1 -w node1 --container-name={name}"
    try:
        first = subprocess.run(["bash", "-c", f"{srun} --container-image={user_image} --container-writable "
                                              f"bash -c 'echo roots > {note}'"],
                               env={**os.environ, **cluster.target.env}, capture_output=True, text=True, timeout=180)
        assert first.returncode == 0, first.stderr
        none = as_user(user, f"{srun} cat {note}", env=conf, timeout=180)
        assert none.returncode != 0 and "roots" not in none.stdout, none.stdout + none.stderr
        assert "no container" in none.stderr or "failed" in none.stderr, none.stderr
        made = as_user(user, f"{srun} --container-image={user_image} --container-writable bash -c "
                             f"'cat {note} 2>/dev/null; echo theirs > {note}'", env=conf, timeout=180)
        assert made.returncode == 0 and made.stdout == "", made.stdout + made.stderr
        again = as_user(user, f"{srun} cat {note}", env=conf, timeout=180)
        assert (again.returncode, again.stdout) == (0, "theirs\n"), again.stdout + again.stderr
        assert roots.is_dir() and theirs.is_dir() and theirs != roots
        root_again = subprocess.run(["bash", "-c", f"{srun} cat {note}"], env={**os.environ, **cluster.target.env},
                                    capture_output=True, text=True, timeout=180)
        assert (root_again.returncode, root_again.stdout) == (0, "roots\n"), root_again.stderr
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(roots), str(theirs)], check=True)


HANG_THEN_DONE = ('if [ "$KIT_RESTART" = 0 ]; then echo "step 1" >"$KIT_PROGRESS_FILE"; echo hanging; sleep 300; '
                  'else echo "run $KIT_RESTART done as $(id -u)"; fi')


def test_an_ordinary_users_hung_job_is_caught_and_requeued(cluster, user):
    """As the user, with no SLURM_CONF (kit finds root's cluster of the machine itself): a job whose first run
    hangs after its first progress is caught by the watchdog (the hang report and its stacks theirs), requeued by
    their own prelaunch, and its second run completes."""
    conf = ""
    job = as_user(user, f"kit launch --nodes 2 --hang-timeout 3 --max-restarts 1 --no-exporter --wait --json -- "
                        f"bash -c {shlex.quote(HANG_THEN_DONE)}", env=conf, timeout=600)
    assert "using this machine's local cluster" in job.stderr, job.stderr
    first = json.loads(job.stdout.splitlines()[0])
    assert job.returncode == 0, job.stderr + read_logs(first["job_dir"])
    job_dir = Path(first["job_dir"])
    runs = [json.loads(line) for line in (job_dir / "runs.jsonl").read_text().splitlines()]
    assert [r["end"] for r in runs] == ["hang", "finished"], runs
    assert (job_dir / "hang" / "r0").is_dir() and os.stat(job_dir / "hang" / "r0").st_uid == user.pw_uid
    logs = as_user(user, f"kit logs {job_dir} --errors", env=conf).stdout
    assert "hang" in logs.lower(), logs
    assert f"run 1 done as {user.pw_uid}" in as_user(user, f"kit logs {job_dir}", env=conf).stdout

