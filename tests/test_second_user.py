"""A real second Linux user (created here, removed after) cannot
run commands as root through the local cluster, read a job's --env values, or make root's
day-two commands load a Slurm configuration it planted."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers import kit, remove_user, require, wait_for


@pytest.fixture(scope="module")
def other_user():
    name = f"kitu{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        remove_user(name)


def as_user(user, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["su", user.pw_name, "-s", "/bin/sh", "-c", command], capture_output=True, text=True, timeout=timeout, cwd="/"
    )


@pytest.fixture
def public(tmp_path) -> Path:
    """A directory the other user can read and enter."""
    d = tmp_path / "public"
    d.mkdir()
    for p in (tmp_path, d):
        os.chmod(p, 0o755)
    os.chmod(tmp_path.parent, 0o755)
    return d


def test_a_second_user_cannot_run_as_root_through_the_local_cluster(cluster, other_user, public):
    """Finding 4: with `LD_PRELOAD` of a library whose getuid() says 0, and the cluster's own
    configuration (worst case: it knows every port), the other user gets no root shell:
    the cluster authenticates through its own munged, and its directory is root's alone."""
    require("gcc")
    src = public / "fakeroot.c"
    src.write_text(
        "#include <sys/types.h>\nuid_t getuid(void){return 0;}\nuid_t geteuid(void){return 0;}\n"
        "gid_t getgid(void){return 0;}\ngid_t getegid(void){return 0;}\n"
    )
    lib = public / "fakeroot.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    assert cluster.state().auth == "munge", "munged is installed by .ci/setup: the cluster must use it"
    assert not os.stat(cluster.root).st_mode & 0o077
    conf = Path(cluster.conf).read_text()
    variants = {
        "munge": conf,
        "none": conf.replace("AuthType=auth/munge", "AuthType=auth/none").replace(
            "CredType=cred/munge", "CredType=cred/none"
        ),
    }
    for name, text in variants.items():
        path = public / f"{name}.conf"
        path.write_text(
            "\n".join(line for line in text.splitlines() if not line.startswith(("PlugStackConfig", "AuthInfo")))
            + (f"\nAuthInfo=socket={cluster.public}/munge/munge.socket\n" if name == "munge" else "\n")
        )
        os.chmod(path, 0o644)
        # A root shell, were it given, comes in 1-3 s here; srun refused retries until killed.
        proc = as_user(
            other_user,
            f"SLURM_CONF={path} LD_PRELOAD={lib} timeout 15 srun -N1 -t 1 sh -c 'id -u; head -c 20 /etc/shadow'",
        )
        assert proc.returncode != 0, (name, proc.stdout, proc.stderr)
        assert "root:" not in proc.stdout and not proc.stdout.strip().startswith("0"), (name, proc.stdout)


def test_env_values_are_not_readable_by_another_user(cluster, other_user, public):
    """Finding 7: `--env HF_TOKEN=...` lives in job.json and job.env: the job directory
    is its user's alone."""
    out = public / "jobs"
    proc = kit(
        "launch",
        "--local",
        "--output-dir",
        str(out),
        "--env",
        "HF_TOKEN=hf_secret_value",
        "--no-exporter",
        "--dry-run",
        "--",
        "true",
    )
    assert proc.returncode == 0, proc.stderr
    job_dir = next(p for p in out.iterdir() if not p.name.startswith("."))
    assert "hf_secret_value" in (job_dir / "job.json").read_text()
    assert "hf_secret_value" in (job_dir / "job.env").read_text()
    assert oct(os.stat(job_dir).st_mode & 0o777) == "0o700"
    read = as_user(other_user, f"cat {job_dir}/job.json {job_dir}/job.env; grep -r hf_secret {out}")
    assert "hf_secret_value" not in read.stdout, read.stdout


def test_root_does_not_follow_a_planted_slurm_json(cluster, other_user, public, tmp_path):
    """Finding 6: a job directory the other user owns names a Slurm configuration of theirs
    (with a PluginDir holding their code): root's `kit ps` and `kit cancel` refuse to use it,
    in one line, and run none of it."""
    evil = public / "evil"
    evil.mkdir()
    marker = tmp_path / "ran-as-root"
    plugin_dir = evil / "plugins"
    plugin_dir.mkdir()
    code = evil / "evil.c"  # a plugin whose constructor leaves a mark when loaded
    code.write_text(
        "#include <stdio.h>\n__attribute__((constructor)) static void mark(void) "
        f'{{ FILE *f = fopen({json.dumps(str(marker))}, "w"); if (f) fclose(f); }}\n'
        'const char plugin_name[] = "evil"; const char plugin_type[] = "auth/evil";\n'
        "const unsigned int plugin_version = 0; const int plugin_id = 999;\n"
    )
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(plugin_dir / "auth_evil.so"), str(code)], check=True)
    (evil / "slurm.conf").write_text(
        f"ClusterName=evil\nSlurmctldHost=localhost\nPluginDir={plugin_dir}\nAuthType=auth/evil\n"
    )
    job = public / "shared" / "kit-20260101-000000-abcdef"
    job.mkdir(parents=True)
    (job / "slurm.json").write_text(json.dumps({"target": "site", "conf": str(evil / "slurm.conf")}))
    (job / "job_id").write_text("4242\n")
    (job / "job.json").write_text(json.dumps({"job_name": "evil\x1b]0;owned\x07"}))
    uid = other_user.pw_uid
    for path in (evil, evil / "slurm.conf", job.parent, job, *job.iterdir()):
        os.chown(path, uid, uid)
    cancel = kit("cancel", str(job))
    assert cancel.returncode != 0 and "Traceback" not in cancel.stderr
    note, error = cancel.stderr.splitlines()[:2]  # whose directory it is, then why nothing is done
    assert note == f"kit: note: {job} is {other_user.pw_name}'s job directory, not yours", cancel.stderr
    assert "not trusted" in error, cancel.stderr
    ps = kit("ps", "--output-dir", str(job.parent))
    assert ps.returncode == 0 and "Traceback" not in ps.stderr and not marker.exists(), ps.stderr
    row = next(line for line in ps.stdout.splitlines() if line.startswith("4242"))
    assert "UNKNOWN" in row and "\x1b" not in row and "evil\\x1b]0;owned\\x07" in row, row  # finding 22
    rows = json.loads(kit("ps", "--json", "--output-dir", str(job.parent)).stdout)
    assert "not trusted" in next(r for r in rows if r["id"] == "4242")["state_from"]
    assert not marker.exists()


@pytest.fixture
def under_tmp():
    """A directory of root's under /tmp that the other user can enter (pytest's own is root's 0700)."""
    d = Path(tempfile.mkdtemp(prefix="kit-test-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def scratch(kit_home):
    """A shared scratch directory under /tmp, group-writable and not sticky (anyone can rename
    what lies in it), on another file system than the code store's home: a tmpfs mounted on
    $KIT_HOME/code for the test (as home on NFS, jobs on scratch), so kit keeps the code store
    beside the jobs. (Mounted there, not on the scratch: the nodes' slurmd must see the jobs,
    and this process may be in a mount namespace of its own.)"""
    d = Path(tempfile.mkdtemp(prefix="kit-scratch-"))
    os.chmod(d, 0o755)  # opened to all (0777) by the test once its job is launched: kit launch refuses it so
    code = kit_home / "code"
    code.mkdir(mode=0o700, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(code)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(code)], check=True)
        shutil.rmtree(d, ignore_errors=True)


def test_root_rerun_never_runs_a_store_another_user_swapped_in(cluster, other_user, public, scratch, tmp_path):
    """In an output directory opened to all (group-writable, non-sticky) after root's launch, another user renames
    root's code store away and puts their own in its place — the same manifest (its digest is
    what root's job records) and an object of that name holding their code. Root's `kit rerun`
    refuses the store in one line, runs nothing of theirs and submits nothing."""
    shared = scratch
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "run.sh").write_text("echo honest\n")

    def git(*a):
        return subprocess.run(
            ["git", "-C", str(repo), "-c", "user.email=t@kit", "-c", "user.name=t", *a], check=True, capture_output=True
        )

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "one")
    env = {}
    proc = kit(
        "launch",
        "--local",
        "--no-exporter",
        "--wait",
        "--output-dir",
        str(shared),
        "--",
        "bash",
        "run.sh",
        cwd=repo,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr + "".join(p.read_text() for p in shared.glob("*/logs/slurm-*.out"))
    job_dir = Path(proc.stdout.split("job dir: ")[1].splitlines()[0].strip())
    os.chmod(shared, 0o777)  # the directory opened to all after the launch (a launch into it is refused)
    store = shared / f".kit-code-{os.geteuid()}"
    snap = json.loads((job_dir / "job.json").read_text())["snapshot"]
    assert snap["store"] == str(store)
    manifest = (store / "manifests" / (snap["digest"].split(":")[1] + ".json")).read_text()
    obj = json.loads(manifest)[0][2]
    marker = tmp_path / "ran-their-code"
    (shared / "manifest.json").write_text(manifest)
    os.chmod(shared / "manifest.json", 0o644)
    planted = as_user(
        other_user,
        f"""set -e; cd {shared}
        mv .kit-code-0 .moved-away
        mkdir -p .kit-code-0/manifests .kit-code-0/objects
        cp manifest.json .kit-code-0/manifests/{snap["digest"].split(":")[1]}.json
        printf 'touch {marker}; echo evil\\n' > .kit-code-0/objects/{obj}
        chmod -R go-w .kit-code-0""",
    )
    assert planted.returncode == 0, planted.stderr
    before = set(shared.iterdir())
    again = kit("rerun", str(job_dir), "--wait", env=env)
    assert again.returncode != 0 and "Traceback" not in again.stderr, again.stderr
    assert again.stderr.startswith("kit: JOB: ") and "not a directory of this user's own" in again.stderr, again.stderr
    assert not marker.exists() and set(shared.iterdir()) == before  # nothing ran, nothing written


def test_a_requeue_puts_back_the_code_it_hashed_never_a_store_swapped_between(other_user, under_tmp):
    """On a requeue prelaunch puts back a snapshot file a run changed (kit::_restore_entry). In a
    group-writable, non-sticky output directory another user renames root's code store away and
    puts theirs in its place the moment prelaunch has hashed the object (here: as the hash ends,
    through a sha256sum on PATH). What is put back is what was hashed — root's code, never theirs
    — and the next entry is refused with the store, now another owner's, named."""
    from test_bash_rules import LAUNCH, bash_functions

    tmp_path = under_tmp
    shared = tmp_path / "scratch"
    shared.mkdir()
    os.chmod(shared, 0o777)  # group-writable and not sticky: anyone can rename what lies in it
    honest = b"echo honest\n"
    name = hashlib.sha256(honest).hexdigest()
    store = shared / ".kit-code-0"
    (store / "objects").mkdir(parents=True, mode=0o700)
    os.chmod(store, 0o700)
    (store / "objects" / name).write_bytes(honest)
    view = tmp_path / "job" / "code"
    view.mkdir(parents=True)
    swap = tmp_path / "swap.sh"  # theirs: root's store renamed away, theirs put in its place
    swap.write_text(
        f"set -e; cd {shared}; mv .kit-code-0 .moved-away; mkdir -p .kit-code-0/objects\n"
        f"echo 'touch {tmp_path}/ran-their-code' > .kit-code-0/objects/{name}; chmod -R go-w .kit-code-0\n"
    )
    os.chmod(swap, 0o644)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sha256sum").write_text(
        '#!/bin/bash\n/usr/bin/sha256sum "$@"\n'
        f"if [[ ! -e {shared}/.moved-away ]]; then su {other_user.pw_name} -s /bin/sh -c 'sh {swap}' >&2; fi\n"
    )
    os.chmod(bin_dir / "sha256sum", 0o755)
    fns = (LAUNCH / "lib.sh").read_text() + bash_functions("kit::_owned_store", "kit::_restore_entry")
    script = (
        fns + f'KIT_RESTART=1\nkit::_restore_entry f "{store}/objects/{name}" "{view}" run.sh\n'
        f'kit::_restore_entry f "{store}/objects/{name}" "{view}" tool.sh\n'
    )
    proc = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + script],
        capture_output=True,
        text=True,
        env={"PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"},
        timeout=60,
    )
    assert (shared / ".moved-away").is_dir(), proc.stderr  # the other user's swap happened
    put_back = (view / "run.sh").read_bytes() if (view / "run.sh").exists() else None
    assert put_back == honest, (put_back, proc.stderr)
    assert proc.returncode == 2 and not (view / "tool.sh").exists(), proc.stderr
    assert (
        f"error: code/: the code store {store}/objects is not a directory of this user's own that only its "
        "owner can write: not run"
    ) in proc.stderr, proc.stderr
    assert [p.name for p in view.iterdir()] == ["run.sh"]  # no copy of theirs left behind


def test_a_directory_planted_with_roots_job_id_is_not_believed(cluster, other_user, under_tmp):
    """In an output directory opened to all (group-writable, non-sticky) once root's jobs run, another user plants
    job directories naming the ids of root's running jobs, with logs of their own. Root's `kit logs ID` shows root's own job, `kit ps` lists
    it once, `kit cancel PLANTED` is refused (the directory is theirs, the job root's: nothing cancelled),
    a command acting on their directory says whose it is, and `kit trim` is not stopped by it."""
    shared = under_tmp / "scratch"
    shared.mkdir()
    os.chmod(shared, 0o755)  # opened to all once root's jobs are launched (a launch into it is refused)
    launched = []
    for name in ("mine", "other"):
        proc = kit(
            "launch",
            "--local",
            "--no-exporter",
            "--job-name",
            name,
            "--output-dir",
            str(shared),
            "--",
            "bash",
            "-c",
            f"echo honest-{name}; sleep 300",
        )
        assert proc.returncode == 0, proc.stderr
        job_dir = Path(proc.stdout.split("job dir: ")[1].splitlines()[0].strip())
        launched.append((job_dir, (job_dir / "job_id").read_text().strip()))
    (mine, mine_id), (other, other_id) = launched
    try:
        for d in (mine, other):
            wait_for(
                lambda d=d: b"honest-" in b"".join(p.read_bytes() for p in (d / "logs").glob("*")),
                120,
                what="the job to run",
            )
        os.chmod(shared, 0o777)  # once they run (prelaunch would refuse to start in it)
        planted = as_user(
            other_user,
            f"""set -e; cd {shared}
            for id in {mine_id} {other_id}; do
              mkdir -p planted-$id/logs; echo $id > planted-$id/job_id
              for f in {" ".join(p.name for p in (mine / "logs").iterdir())}; do echo "0: PLANTED" > planted-$id/logs/$f; done
            done""",
        )
        assert planted.returncode == 0, planted.stderr
        logs = kit("logs", mine_id, "--output-dir", str(shared))
        assert logs.returncode == 0 and "honest-mine" in logs.stdout and "PLANTED" not in logs.stdout, logs.stdout
        rows = json.loads(kit("ps", "--json", "--output-dir", str(shared)).stdout)
        assert sorted(r["job_dir"] for r in rows if r["id"] in (mine_id, other_id)) == sorted(
            str(d.resolve()) for d in (mine, other)
        ), rows
        refused = kit("cancel", str(shared / f"planted-{other_id}"))
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.splitlines()[:2] == [
            f"kit: note: {shared / f'planted-{other_id}'} is {other_user.pw_name}'s job directory, not yours",
            f"kit: JOB: {shared / f'planted-{other_id}'} is {other_user.pw_name}'s, and job {other_id} is root's "
            "job: not acted on",
        ], refused.stderr
        assert squeue_state(cluster, other_id) == "RUNNING"
        trimmed = kit("trim", "--output-dir", str(shared))
        assert trimmed.returncode == 0, trimmed.stderr
    finally:
        for _, job_id in launched:
            subprocess.run(["scancel", job_id], env={**os.environ, "SLURM_CONF": str(cluster.conf)}, check=False)


def squeue_state(cluster, job_id: str) -> str:
    proc = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T"],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": str(cluster.conf)},
    )
    return proc.stdout.strip()


def test_an_output_directory_another_user_can_replace_is_refused(cluster, other_user, under_tmp):
    """Whoever owns the directory a job directory sits in (or anyone, where all can write it and it is not sticky)
    can rename the job's directory away before it starts and put their own scripts in its place. `kit launch`
    refuses such an --output-dir in one line, writing nothing there; a sticky shared one (/tmp's kind) is accepted."""
    theirs, everyones, sticky = (under_tmp / n for n in ("theirs", "everyones", "sticky"))
    for d, mode in ((theirs, 0o755), (everyones, 0o777), (sticky, 0o1777)):
        d.mkdir()
        os.chmod(d, mode)
    os.chown(theirs, other_user.pw_uid, other_user.pw_gid)
    for d, why in (
        (theirs, f"it is {other_user.pw_name}'s"),
        (everyones, "others can write it (mode 0777, without the sticky bit)"),
    ):
        proc = kit("launch", "--local", "--no-exporter", "--output-dir", str(d), "--", "true")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith(f"kit: --output-dir: {d}: {why}: whoever can replace"), proc.stderr
        assert list(d.iterdir()) == [], list(d.iterdir())
    dry = kit("launch", "--local", "--dry-run", "--no-exporter", "--output-dir", str(sticky), "--", "true")
    assert dry.returncode == 0, dry.stderr


def test_prelaunch_runs_nothing_from_a_job_directory_another_user_could_replace(cluster, other_user, under_tmp):
    """Root's job waits in a directory that then becomes a teammate's (their project, handed over; or a job
    submitted before kit refused such a directory). The teammate renames the waiting job's directory away and puts
    one of theirs in its place, with a job.env of their own: prelaunch sourced it as root. It checks the job
    directory and the one it sits in before it reads anything: the job fails with kit's code 84 and that reason,
    and nothing of theirs ran."""
    from kit.core import outcome

    env = {**os.environ, "SLURM_CONF": str(cluster.conf)}
    team = under_tmp / "team"
    team.mkdir(mode=0o755)
    marker = under_tmp / "ran-as-root"
    blocker = subprocess.run(
        ["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true"], env=env, capture_output=True, text=True
    )
    assert blocker.returncode == 0, blocker.stderr
    blocker_id = blocker.stdout.strip().split(";")[0]
    proc = kit(
        "launch",
        "--local",
        "--no-exporter",
        "--after",
        f"{blocker_id}:any",
        "--output-dir",
        str(team),
        "--json",
        "--",
        "echo",
        "honest",
    )
    assert proc.returncode == 0, proc.stderr
    job = json.loads(proc.stdout.splitlines()[0])
    job_dir, job_id = Path(job["job_dir"]), str(job["job_id"])
    try:
        os.chown(team, other_user.pw_uid, other_user.pw_gid)  # the directory changes hands
        swapped = as_user(
            other_user,
            f"""set -e; cd {team}; mv {job_dir.name} moved-away; mkdir -p {job_dir.name}/logs
            printf 'touch {marker}\\n' > {job_dir.name}/job.env; chmod -R a+rwx {job_dir.name}""",
        )
        assert swapped.returncode == 0, swapped.stderr
        subprocess.run(["scontrol", "release", blocker_id], env=env, check=True)
        wait_for(lambda: squeue_state(cluster, job_id) == "", 120, what="the job to end")

        def ended() -> str | None:
            """The job's end as accounting holds it; slurmdbd has the submission's PENDING row before slurmctld
            hands it the end, so a row that is not an end yet is not the answer."""
            line = subprocess.run(
                ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "state,exitcode"],
                env=env,
                capture_output=True,
                text=True,
            ).stdout.strip()
            return line if line and line.split("|")[0] not in ("PENDING", "RUNNING", "REQUEUED") else None

        accounted = wait_for(ended, 60, what="the job's end in accounting")
        assert not marker.exists()  # their job.env never ran
        assert accounted == f"FAILED|{outcome.UNTRUSTED_DIR}:0", accounted
    finally:
        subprocess.run(["scancel", job_id, blocker_id], env=env, check=False)


def test_prelaunch_exits_with_outcomes_code_for_a_foreign_directory():
    """prelaunch checks its directory before job.env (where kit's other codes come from): its literal is
    kit.core.outcome's, one fact."""
    from helpers import REPO

    from kit.core import outcome

    text = (REPO / "launch" / "prelaunch.sh").read_text()
    assert f"exit {outcome.UNTRUSTED_DIR}\n" in text and f"({outcome.__name__}.UNTRUSTED_DIR)" in text


def test_prelaunchs_check_takes_a_directory_name_as_it_is(tmp_path):
    """A job directory in an --output-dir whose name ends in a newline (kit accepts any name sbatch can write): its
    parent taken by $(dirname …) lost the newline, was not found, and the job failed 84 though all was the user's.
    Taken by expansion; a parent others can write is still refused."""
    from test_bash_rules import bash_functions

    fns = bash_functions("kit::_foreign", "kit::_refuse_foreign")
    for parent, mode, code in (("d-\n", 0o755, 0), ("open", 0o777, 84)):
        job = tmp_path / parent / "job"
        job.mkdir(parents=True, mode=0o700)
        os.chmod(job.parent, mode)
        proc = subprocess.run(
            ["bash", "-c", f'set -euo pipefail\n{fns}kit::_refuse_foreign "$1"; echo ok', "check", str(job)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == code and (proc.stdout == "ok\n") == (code == 0), (parent, proc.stderr)
