"""The local cluster serves every local user, as a site does: an ordinary user (created here, removed
after, with everything they own) with kit installed as a login node's user has it — a venv of Debian's
Python (`python3` here is root's, under /root, which no other user can run), kit's login-side
dependencies only — reaches root's cluster through what `kit cluster env` prints, and runs Slurm's
commands, `kit launch`, a sweep, `kit ps`, `kit logs` and `sacct` there; their jobs run as their own uid.
What is root's stays root's: the munge key, slurmdbd's configuration, the database, the cluster's state."""

from __future__ import annotations

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
    as_user,
    container_mode,
    named_containers,
    read_logs,
    skip_where_squashfuse_is_closed,
    wait_for,
)

from kit.cluster import accounting, public

pytestmark = pytest.mark.cluster


def test_what_is_roots_stays_roots(cluster, user):
    """The client side is every user's (slurm.conf, the plugin stack, munged's socket, the spool); the munge
    key, slurmdbd's configuration, the database and the cluster's own directory are root's alone."""
    assert cluster.public.parent == public.MACHINE and cluster.conf.parent == cluster.public
    for path in (cluster.conf, cluster.public / "plugstack.conf"):
        assert os.stat(path).st_mode & 0o777 == 0o644, path
    secret = [
        cluster.root / "munge" / "munge.key",
        cluster.public / "slurmdbd.conf",
        accounting.directory(cluster.root),
        cluster.root / "state",
        cluster.root,
    ]
    for path in secret:
        st = os.stat(path)
        assert st.st_uid == 0 and not st.st_mode & 0o077, (path, oct(st.st_mode))
    proc = as_user(
        user, " ; ".join(f"{'ls' if p.is_dir() else 'cat'} {p} >/dev/null 2>&1 || echo refused" for p in secret)
    )
    assert proc.stdout.split() == ["refused"] * len(secret), proc.stdout + proc.stderr


def test_an_ordinary_user_runs_slurm_and_kit_on_roots_cluster(cluster, user):
    """`kit cluster env` (theirs: root's cluster, found where every user reads; `kit cluster status` names it), then
    Slurm's own commands and kit's, as that user: each job runs as their uid, kit ps, kit logs and sacct see it."""
    # The newest of root's clusters on the machine: the session's, or another session's started beside it.
    newest = {public.clusters()[0]}
    env = as_user(user, "kit cluster env")
    status = as_user(user, "kit cluster status")  # theirs is not running; root's is named, with how to use it
    newest.add(public.clusters()[0])
    assert cluster.conf in public.clusters()
    assert env.returncode == 0 and any(env.stdout.splitlines() == public.login_lines(c) for c in newest), env
    # One cluster running: that one named; several (other sessions' beside this one): each listed by id.
    said = status.stdout.splitlines()[1:]
    assert status.returncode == 1 and (
        said[0]
        in [
            f"this machine's local cluster (root's, every local user's): SLURM_CONF={c}; use it "
            'with: eval "$(kit cluster env)"'
            for c in newest
        ]
        or (
            said[0].startswith("this machine's local clusters (root's, every local user's)")
            and f"  {public.cluster_id(cluster.conf)}  SLURM_CONF={cluster.conf}" in said
        )
    ), status.stdout
    conf = f"; export SLURM_CONF={cluster.conf}"  # a site's login shell has it; the newest of several is ours
    slurm = as_user(
        user, "sinfo -h -o %D && sbatch --wait -N2 -o slurm.out --wrap 'srun -l id -u' && sort slurm.out", env=conf
    )
    uid = user.pw_uid
    assert slurm.returncode == 0 and slurm.stdout.split()[0] == "2", slurm.stdout + slurm.stderr
    assert slurm.stdout.splitlines()[-2:] == [f"0: {uid}", f"1: {uid}"], slurm.stdout

    launched = as_user(
        user, "kit launch --nodes 2 --wait --no-exporter --json -- bash -c 'echo rank $RANK uid $(id -u)'", env=conf
    )
    assert launched.returncode == 0, launched.stderr
    job = json.loads(launched.stdout.splitlines()[0])
    assert Path(job["job_dir"]).is_relative_to(user.pw_dir) and os.stat(job["job_dir"]).st_uid == uid
    logs = as_user(user, f"kit logs {job['job_id']}", env=conf)
    assert sorted(logs.stdout.splitlines()) == [f"0: rank 0 uid {uid}", f"1: rank 1 uid {uid}"], (
        logs.stdout + logs.stderr
    )
    sweep = as_user(user, "kit launch --sweep LR=0.1,0.2 --wait --no-exporter -- bash -c 'echo lr $LR'", env=conf)
    assert sweep.returncode == 0, sweep.stderr
    ps = as_user(user, "kit ps --json", env=conf)
    rows = json.loads(ps.stdout)
    assert {r["id"]: r["state"] for r in rows}[str(job["job_id"])] == "COMPLETED", rows
    assert (
        len(
            [
                r
                for r in rows
                if "_" in r["id"] and r["state"] == "COMPLETED" and r["job_dir"].startswith(f"{user.pw_dir}/kit-jobs/")
            ]
        )
        == 2
    ), rows  # the sweep's (kit-jobs: the default)
    accounted = as_user(user, f"sacct -n -X -j {job['job_id']} -o state,user%20", env=conf)
    assert accounted.stdout.split() == ["COMPLETED", user.pw_name], accounted.stdout + accounted.stderr


@pytest.mark.parametrize("mode", ["create", "squashfuse"])
def test_a_container_mounts_only_what_its_user_can_reach(cluster, user, user_image, secret_image, tmp_path, mode):
    """--container-mounts opens each source as the job's user, as enroot does in their namespace: the stand-in
    resolved the paths as slurmstepd's root, so a file readable by all behind a directory closed to the user
    (another user's job directory under their 0700 home) was theirs to read through a mount. Theirs mounts. The
    image likewise."""
    skip_where_squashfuse_is_closed(cluster, mode)
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
        # An image only root reads, where all can see it: the stand-in opened it as root (a loop mount in create
        # mode, unsquashfs for a named container): the user ran root's image. Refused; as enroot, run as them.
        for name in ("", "--container-name=kit-secret"):
            run = as_user(
                user, f"srun -N1 --container-image={secret_image} {name} cat /etc/kit-secret", env=conf, timeout=180
            )
            assert run.returncode != 0 and "not theirs" not in run.stdout, run.stdout + run.stderr


def test_an_image_with_device_nodes_is_refused_in_create_mode_for_an_ordinary_user(cluster, user, tmp_path):
    """Real enroot unpacks the image as the job's user in create mode, and unsquashfs cannot make a device node
    for them ("create_inode: could not create character device …/dev/null, because you're not superuser!"): the
    container is not made, the task fails. The stand-in ran it (a loop mount as root); it fails the same way now,
    in enroot's words."""
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    image = Path(user.pw_dir) / "with-devices.sqsh"
    subprocess.run(
        ["mksquashfs", str(root), str(image), "-noappend", "-quiet", "-no-progress", "-p", "dev/null c 666 0 0 1 3"],
        check=True,
    )
    os.chown(image, user.pw_uid, user.pw_gid)
    srun = f"srun -N1 --container-image={image} --container-workdir=/ /bin/true"
    with container_mode(cluster, "create"):
        theirs = as_user(user, srun, env=f"; export SLURM_CONF={cluster.conf}", timeout=180)
        assert theirs.returncode != 0, theirs.stdout + theirs.stderr
        assert "could not create" in theirs.stderr and "because you're not superuser!" in theirs.stderr, theirs.stderr
        assert "/dev/null" in theirs.stderr, theirs.stderr


@pytest.fixture
def secret_image():
    """A squashfs image that only root reads (0600), in a directory every user reads."""
    d = Path(tempfile.mkdtemp(prefix="kit-test-", dir="/var/tmp"))
    try:
        os.chmod(d, 0o755)
        (d / "root" / "etc").mkdir(parents=True)
        (d / "root" / "etc" / "kit-secret").write_text("not theirs\n")
        image = d / "secret.sqsh"
        subprocess.run(["mksquashfs", str(d / "root"), str(image), "-quiet", "-no-progress"], check=True)
        image.chmod(0o600)
        yield image
    finally:
        shutil.rmtree(d)


def test_a_named_container_is_its_users_own(cluster, user, base_image):
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
        first = subprocess.run(
            ["bash", "-c", f"{srun} --container-image={base_image} --container-writable bash -c 'echo roots > {note}'"],
            env={**os.environ, **cluster.target.env},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert first.returncode == 0, first.stderr
        none = as_user(user, f"{srun} cat {note}", env=conf, timeout=180)
        assert none.returncode != 0 and "roots" not in none.stdout, none.stdout + none.stderr
        assert "no container" in none.stderr or "failed" in none.stderr, none.stderr
        made = as_user(
            user,
            f"{srun} --container-image={base_image} --container-writable bash -c "
            f"'cat {note} 2>/dev/null; echo theirs > {note}'",
            env=conf,
            timeout=180,
        )
        assert made.returncode == 0 and made.stdout == "", made.stdout + made.stderr
        again = as_user(user, f"{srun} cat {note}", env=conf, timeout=180)
        assert (again.returncode, again.stdout) == (0, "theirs\n"), again.stdout + again.stderr
        assert roots.is_dir() and theirs.is_dir() and theirs != roots
        root_again = subprocess.run(
            ["bash", "-c", f"{srun} cat {note}"],
            env={**os.environ, **cluster.target.env},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert (root_again.returncode, root_again.stdout) == (0, "roots\n"), root_again.stderr
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(roots), str(theirs)], check=True)


HANG_THEN_DONE = (
    'if [ "$KIT_RESTART" = 0 ]; then echo "step 1" >"$KIT_PROGRESS_FILE"; echo hanging; sleep 300; '
    'else echo "run $KIT_RESTART done as $(id -u)"; fi'
)


@pytest.mark.machine_wide  # finds root's newest cluster itself: alone (tests/conftest.py)
def test_an_ordinary_users_hung_job_is_caught_and_requeued(cluster, user):
    """As the user, with no SLURM_CONF (kit finds root's cluster of the machine itself): a job whose first run
    hangs after its first progress is caught by the watchdog (the hang report and its stacks theirs), requeued by
    their own prelaunch, and its second run completes."""
    conf = ""
    job = as_user(
        user,
        f"kit launch --nodes 2 --hang-timeout 3 --max-restarts 1 --no-exporter --wait --json -- "
        f"bash -c {shlex.quote(HANG_THEN_DONE)}",
        env=conf,
        timeout=600,
    )
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


def test_job_one_of_two_fresh_clusters_takes_two_ports(user, tmp_path):
    """Two local clusters on one machine, each numbering its jobs from 1: root's job 1 on one and an ordinary
    user's job 1 on the other, started together, each printing MASTER_PORT and binding nothing for 20 s (real
    pyxis's create mode leaves 10-40 s between the pick and the bind). Each user's own port lock could not see the
    other's, and the scan started from the job id alone: both took the same port. Now two ports."""
    from helpers import require

    from kit.cluster import LocalCluster

    require("slurmctld")
    clusters = [LocalCluster(tmp_path / name) for name in ("a", "b")]
    hold = "echo port=$MASTER_PORT; sleep 20"
    jobs = []
    try:
        for c in clusters:
            c.up(nodes=1, cpus_per_node=2, accounting=False)
        out = tmp_path / "roots-jobs"
        roots = subprocess.run(
            [
                sys.executable,
                "-m",
                "kit",
                "launch",
                "--json",
                "--no-exporter",
                "--output-dir",
                str(out),
                "--",
                "bash",
                "-c",
                hold,
            ],
            env={**os.environ, **clusters[0].target.env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert roots.returncode == 0, roots.stderr
        theirs = as_user(
            user,
            f"kit launch --json --no-exporter -- bash -c {shlex.quote(hold)}",
            env=f"; export SLURM_CONF={clusters[1].conf}",
        )
        assert theirs.returncode == 0, theirs.stderr
        jobs = [json.loads(p.stdout.splitlines()[0]) for p in (roots, theirs)]
        assert [str(j["job_id"]) for j in jobs] == ["1", "1"], jobs
        ports = [wait_port(Path(j["job_dir"])) for j in jobs]
        assert ports[0] != ports[1], ports
    finally:
        for c in clusters:
            c.down(force=True)


def wait_port(job_dir: Path) -> str:
    """The port a job's command printed (``port=N``), once it has."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        found = re.search(r"port=(\d+)", read_logs(job_dir))
        if found:
            return found.group(1)
        time.sleep(0.3)
    raise AssertionError(f"no port in {job_dir}'s logs: {read_logs(job_dir)}")


def test_prometheus_sees_every_users_jobs_and_no_user_touches_anothers_targets(cluster, user):
    """The cluster's Prometheus discovered only root's jobs' exporters (its target directory was root's, in root's
    0700 directory). Each user now has their own in the public one (made by the Prolog, theirs, 0755): an ordinary
    user's job is scraped, labelled owner=<them>. Playing that user: they cannot add to, change or remove root's
    targets, nor write beside the users' directories, and a target file of theirs saying owner="root" is still
    labelled theirs (the owner comes from the directory)."""
    import urllib.request

    from kit.cluster import config

    conf = f"; export SLURM_CONF={cluster.conf}"
    targets, name = cluster.prometheus_targets, user.pw_name
    launched = as_user(user, "kit launch --nodes 1 --json -- bash -c 'sleep 60'", env=conf)
    assert launched.returncode == 0, launched.stderr
    job_id = str(json.loads(launched.stdout.splitlines()[0])["job_id"])
    roots = targets / "root"
    roots.mkdir(exist_ok=True)
    planted = roots / "kit-root-target.json"  # a target of root's, as root's exporter writes one
    planted.write_text('[{"targets": ["127.0.0.1:1"], "labels": {"slurm_job_id": "r1"}}]\n')

    def scraped() -> list[dict]:
        with urllib.request.urlopen(f"{cluster.prometheus_url()}/api/v1/targets", timeout=5) as r:
            return json.load(r)["data"]["activeTargets"]

    def target(job: str, timeout: float) -> dict:
        return wait_for(
            lambda: next((t for t in scraped() if t["labels"].get("slurm_job_id") == job), None),
            timeout,
            poll=1,
            what=f"Prometheus to discover job {job}'s target",
        )

    try:
        mine = target(job_id, 90)
        assert mine["labels"]["owner"] == name and mine["labels"]["slurm_user"] == name, mine["labels"]
        own = (targets / name).stat()
        assert (own.st_uid, own.st_mode & 0o7777) == (user.pw_uid, 0o755)
        # Playing the user: root's targets, the directory beside theirs, and a forged owner.
        forged = targets / name / "forged.json"
        tries = as_user(
            user,
            f"for f in {shlex.quote(str(roots / 'x.json'))} {shlex.quote(str(targets / 'x.json'))}; do "
            f'  (echo "[]" > "$f") 2>/dev/null && echo "wrote $f"; done; '
            f"rm -f {shlex.quote(str(planted))} 2>/dev/null && echo removed; "
            f"(echo '[]' > {shlex.quote(str(planted))}) 2>/dev/null && echo changed; "
            f"mkdir {shlex.quote(str(targets / 'root2'))} 2>/dev/null && echo made; "
            f"mv {shlex.quote(str(roots))} {shlex.quote(str(targets / name / 'stolen'))} 2>/dev/null && echo moved; "
            f'echo \'[{{"targets": ["127.0.0.1:2"], "labels": {{"owner": "root", "slurm_job_id": "f1"}}}}]\' '
            f"> {shlex.quote(str(forged))}; true",
            env=conf,
        )
        assert tries.stdout == "", tries.stdout  # none of it worked
        assert planted.read_text().startswith('[{"targets": ["127.0.0.1:1"]')
        assert not any(p.exists() for p in (targets / "x.json", roots / "x.json", targets / "root2"))
        faked = target("f1", 60)
        assert faked["labels"]["owner"] == name, faked["labels"]  # theirs, whatever the file says
        roots_own = target("r1", 60)
        assert roots_own["labels"]["owner"] == "root"
    finally:
        as_user(user, f"scancel {job_id}; rm -f {shlex.quote(str(targets / name / 'forged.json'))}", env=conf)
        planted.unlink(missing_ok=True)
    assert config.TARGETS == targets.name
