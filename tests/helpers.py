"""What the tests share besides fixtures: running kit, submitting and waiting for jobs,
finding a job's processes, reading its logs and records, checking how it ended."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kit import slurm
from kit.jobdir import JobDir

REPO = Path(__file__).resolve().parent.parent
# Every rank all-reduces its rank: one world of N prints sum N*(N-1)/2 on every rank.
ALL_REDUCE = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
print(f"rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item()}", flush=True)
dist.destroy_process_group()
"""

INSTALL = {
    "slurmctld": "apt-get install -y slurm-wlm",
    "shellcheck": "apt-get install -y shellcheck",
    "prometheus": "apt-get install -y prometheus",
    "promtool": "apt-get install -y prometheus",
    "debootstrap": "apt-get install -y debootstrap",
    "umoci": "apt-get install -y umoci",
    "skopeo": "apt-get install -y skopeo",
    "slurmdbd": "apt-get install -y slurmdbd mariadb-server",
    "mariadbd": "apt-get install -y slurmdbd mariadb-server",
}


def listening(pid: int) -> set[str]:
    """The ``address:port`` of every TCP socket process ``pid`` listens on, in its own network namespace
    (``/proc/PID/net/tcp`` and ``tcp6``): ``0.0.0.0`` or ``::`` for every address."""
    import ipaddress

    mine = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                mine.add(target[8:-1])
    out = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in mine:  # LISTEN
                    addr, port = fields[1].split(":")
                    raw = b"".join(bytes.fromhex(addr[i : i + 8])[::-1] for i in range(0, len(addr), 8))
                    out.add(f"{ipaddress.ip_address(raw)}:{int(port, 16)}")
    return out


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed: {INSTALL.get(tool, 'install it')} (or run .ci/run)", pytrace=False)
    return path


def kit(*args: str, env: dict | None = None, cwd=None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real `kit` command line in a subprocess."""
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "kit", *args], capture_output=True, text=True, env=full, cwd=cwd, timeout=timeout
    )


def launch_and_wait(
    tmp_path: Path, *args: str, command: list[str], env: dict | None = None, timeout: float = 300
) -> tuple[subprocess.CompletedProcess, Path]:
    """`kit launch --local --wait` from ``tmp_path`` (jobs in ``tmp_path/jobs``): the finished call and the job
    directory it printed."""
    proc = kit(
        "launch", "--local", "--wait", "--output-dir", str(tmp_path / "jobs"), *args, "--", *command,
        env=env, cwd=tmp_path, timeout=timeout,
    )  # fmt: skip
    m = re.search(r"^job dir: (.+)$", proc.stdout, re.M)
    assert m, proc.stdout + proc.stderr
    return proc, Path(m.group(1))


def submit(tmp_path: Path, *args: str, command: list[str], timeout: float = 300) -> dict:
    """`kit launch --local --json ...`; returns {job_id, job_dir, sbatch_argv}."""
    proc = kit(
        "launch",
        "--local",
        "--json",
        "--output-dir",
        str(tmp_path / "jobs"),
        *args,
        "--",
        *command,
        cwd=tmp_path,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def task_env(job_dir: Path, rank: int = 0, ntasks: int = 1, **extra: str) -> dict:
    """What srun gives one task of a job directory's step, plus what prelaunch exports."""
    progress = job_dir / "progress" / "r0"
    progress.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_NODEID": str(rank),
        "SLURM_JOB_ID": "7",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "KIT_JOB_DIR": str(job_dir),
        "KIT_LOG_DIR": str(job_dir / "logs"),
        "KIT_PROGRESS_DIR": str(progress),
        "KIT_HANG_DIR": str(job_dir / "hang" / "r0"),
        "KIT_WARNING_SIGNAL": "USR1",
        **extra,
    }


def job_processes(job_dir: str | Path) -> list[tuple[int, str]]:
    """Live processes that belong to a job: its KIT_JOB_DIR in their environment
    or the job directory in their command line."""
    needle_env = f"KIT_JOB_DIR={job_dir}".encode()
    needle_cmd = str(job_dir).encode()
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            if stat[stat.rindex(b")") + 2 :][:1] == b"Z":
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if needle_env in environ or needle_cmd in cmdline:
            found.append((int(entry), cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found


def wait_no_processes(job_dir, timeout: float) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    while True:
        left = job_processes(job_dir)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def stepds_of(cluster, job_id: str) -> list[int]:
    """slurmstepd processes still serving any step of ``job_id`` of ``cluster``: every local cluster numbers its
    jobs from 1, so another's job 1 (a test beside this one) is told apart by the slurm.conf in its environment."""
    conf = f"SLURM_CONF={cluster.target.env['SLURM_CONF']}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                if cmd.startswith(f"slurmstepd: [{job_id}.".encode()):
                    environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                    if conf in environ:
                        found.append(int(entry))
            except OSError:
                continue
    return found


def release_requeued(cluster, job_id: str, job_dir, restarts: int = 1) -> None:
    """Start a requeued job now instead of after Slurm's ~3-minute BeginTime hold.

    Only once its earlier run is gone (processes and slurmstepds: a node whose
    stepd still holds the job is drained as a duplicate) plus 2 s (slurmd
    rejects a credential issued in the same second as the revocation).
    """
    runs_before = set(JobDir(job_dir).run_dirs(JobDir.PROGRESS))

    def begun() -> bool:  # a requeue of kit's own (a begin time seconds away, not Slurm's hold) may be started by
        # the scheduler while this waits: the next run's stepds are then the job's. (Its number is not Slurm's
        # restart count: restarts inside the allocation count too.)
        return bool(set(JobDir(job_dir).run_dirs(JobDir.PROGRESS)) - runs_before)

    wait_for(lambda: slurm.job_status(cluster.target, job_id).restarts == restarts, 90, what="the requeue")
    assert wait_no_processes(job_dir, 45) == []
    wait_for(lambda: not stepds_of(cluster, job_id) or begun(), 45, what="the earlier run's slurmstepd to end")
    if not begun():
        time.sleep(2)
        start_now(cluster, job_id)


def start_now(cluster, job_id: str, check: bool = False) -> None:
    """A pending job's begin time set to now: slurmctld looks at it at once."""
    subprocess.run(
        ["scontrol", "update", f"JobId={job_id}", "StartTime=now"],
        env={**os.environ, **cluster.target.env},
        check=check,
        capture_output=True,
    )


@contextlib.contextmanager
def hastened(cluster, job_id: str):
    """While inside: each requeued run of ``job_id`` starts once the begin time kit's requeue gave it has passed,
    not at the scheduler's next pass (backfill's, up to 30 s later): one ``scontrol update StartTime=now`` then,
    which makes slurmctld look at the job, as that pass would. A test's speed only: the gap itself is
    bench_requeue's, and test_preemption's runs come without this help."""
    stop = threading.Event()
    env = {**os.environ, **cluster.target.env}

    def watch():
        poked = set()
        while not stop.wait(0.5):
            out = subprocess.run(
                ["squeue", "--noheader", "--jobs", job_id, "--Format=State,EligibleTime"],
                env=env,
                capture_output=True,
                text=True,
            ).stdout.split()
            state, begin = (out + ["", ""])[:2]  # (%S turns N/A once the begin time has passed)
            if state != "PENDING" or begin in poked or not re.match(r"\d{4}-\d\d-\d\dT", begin):
                continue
            if time.mktime(time.strptime(begin, "%Y-%m-%dT%H:%M:%S")) < time.time() - 1:
                poked.add(begin)
                start_now(cluster, job_id)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def wait_for(predicate, timeout: float, poll: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def read_logs(job_dir: str | Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(Path(job_dir, "logs").glob("slurm-*.out")))


@dataclass
class Waiting:
    """A `kit launch --wait` running in the background."""

    proc: subprocess.Popen
    job_id: str
    job_dir: Path

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err


def launch_wait(tmp_path: Path, *args: str, command: list[str], env: dict | None = None) -> Waiting:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kit",
            "launch",
            "--local",
            "--wait",
            "--heartbeat",
            "0",
            "--output-dir",
            str(tmp_path / "jobs"),
            *args,
            "--",
            *command,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
    )
    first, second = proc.stdout.readline(), proc.stdout.readline()
    m1, m2 = re.match(r"Submitted job (\d+)$", first), re.match(r"job dir: (.+)$", second)
    if not (m1 and m2):
        proc.kill()
        raise AssertionError(first + second + proc.stderr.read())
    return Waiting(proc, m1.group(1), Path(m2.group(1)))


def scontrol(cluster, *args: str) -> None:
    subprocess.run(
        ["scontrol", *args], env={**os.environ, **cluster.target.env}, check=True, capture_output=True, text=True
    )


def scancel(cluster, job_id: str) -> None:
    subprocess.run(["scancel", job_id], env={**os.environ, **cluster.target.env}, check=True)


def state_is(cluster, job_id: str, *states: str):
    return lambda: slurm.job_status(cluster.target, job_id).state in states


def runs(job_dir: Path) -> list[dict]:
    path = job_dir / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def named_containers(cluster, node: str, uid: int | None = None) -> Path:
    """Where ``node`` of ``cluster`` keeps the named containers of ``uid`` (default: this process's)."""
    from kit.cluster import config

    return config.named_containers(
        cluster.root, cluster.public, cluster.state().containers, node, os.getuid() if uid is None else uid
    )


def lock_holders(path: Path) -> list[int]:
    """The pids holding a flock on ``path`` (/proc/locks, by inode)."""
    inode = os.stat(path).st_ino
    out = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
            out.append(int(fields[4]))
    return out


def _proc(pid: int, what: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{what}").read_bytes()
    except OSError:
        return b""


def _of_a_job(pid: int) -> bool:
    """A process of some job (a batch script, or one with a job directory in its environment), or gone meanwhile."""
    if not Path(f"/proc/{pid}").exists():
        return True
    return b"slurm_script" in _proc(pid, "cmdline") or b"KIT_JOB_DIR=" in _proc(pid, "environ")


def assert_nothing_left(cluster, w: Waiting, uid: int | None = None) -> None:
    """No process, exporter target, mount, unnamed container or held port lock of ``w``'s job (its user's:
    ``uid``, default this process's) is left."""
    uid = os.geteuid() if uid is None else uid
    assert wait_no_processes(w.job_dir, 15) == []
    assert list(cluster.prometheus_targets.glob(f"*/kit-{w.job_id}-*")) == []  # in each user's directory
    assert str(w.job_dir) not in Path("/proc/mounts").read_text()
    # Under real pyxis: no container filesystem of the job left in any node's enroot data
    # (pyxis_<job>.<step>; named ones are kept on purpose and removed by `kit cluster down`).
    nodes = [f"node{i}" for i in range(1, cluster.state().nodes + 1)]
    assert [p for n in nodes for p in named_containers(cluster, n, uid).glob(f"pyxis_{w.job_id}.*")] == []
    for port in set(re.findall(r"MASTER_PORT=(\d+)", read_logs(w.job_dir))):
        lock = Path(os.environ.get("TMPDIR", "/tmp") if uid == os.geteuid() else "/tmp", f"kit-ports-{uid}", port)
        if lock.exists():  # free again, or held by another job (another test's cluster took the port since)
            mine = {pid for pid, _ in job_processes(w.job_dir)}
            for holder in lock_holders(lock):
                assert holder not in mine and _of_a_job(holder), (port, holder)


def check_end(
    cluster, w: Waiting, *, state: str, code: int, finished: bool, log: str | None, ends: list[str] | None
) -> str:
    rc, err = w.finish()
    assert rc == code, err + read_logs(w.job_dir)
    assert f"kit: job {w.job_id} ended {state}" in err and f"(exit code {code})" in err, err
    assert slurm.job_status(cluster.target, w.job_id).state == state
    assert (w.job_dir / "FINISHED").exists() == finished
    if log is not None:
        assert log in read_logs(w.job_dir)
    if ends is not None:
        assert [r["end"] for r in runs(w.job_dir)] == ends
    assert_nothing_left(cluster, w)
    return err


def as_user(user, command: str, timeout: float = 120, env: str = "") -> subprocess.CompletedProcess:
    """``command`` in a login-like shell of ``user`` (their home, their PATH with ~/venv/bin first)."""
    return subprocess.run(
        [
            "su",
            "-",
            user.pw_name,
            "-s",
            "/bin/bash",
            "-c",
            f'export PATH="$HOME/venv/bin:$PATH" {env}; cd ~ && {command}',
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )


@contextlib.contextmanager
def container_mode(cluster, mode: str):
    """The session's cluster in pyxis's ``mode`` ("create", "squashfuse") for what runs inside;
    then back as it was (each new step's slurmstepd reads the mode: no restart)."""
    before = cluster.state().squashfuse
    cluster.up(squashfuse=mode == "squashfuse")
    try:
        yield
    finally:
        cluster.up(squashfuse=before)


@dataclass(frozen=True)
class Person:
    """An ordinary user of root's local cluster, as a login node's user: their commands in a login-like shell
    of theirs (their venv's kit first on PATH, SLURM_CONF as a site's login shell has it), in a directory of
    their own."""

    entry: object  # pwd.struct_passwd
    conf: Path
    dir: Path

    @property
    def uid(self) -> int:
        return self.entry.pw_uid

    @property
    def name(self) -> str:
        return self.entry.pw_name

    def run(
        self, argv: list[str], cwd: Path | None = None, env: dict | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        """``argv`` as them in ``cwd`` (default: their directory), with ``env``'s values exported first."""
        exports = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in {"SLURM_CONF": self.conf, **(env or {})}.items())
        return as_user(
            self.entry,
            f"cd {shlex.quote(str(cwd or self.dir))} && export {exports} && exec {shlex.join(argv)}",
            timeout=timeout,
        )

    def kit(
        self, *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        return self.run(["kit", *args], cwd=cwd, env=env, timeout=timeout)

    def own(self, *paths: Path) -> None:
        """What the test made for them (files, directories, all below) becomes theirs."""
        subprocess.run(["chown", "-R", f"{self.uid}:{self.entry.pw_gid}", *map(str, paths)], check=True)


def job_dir_of(proc: subprocess.CompletedProcess) -> str:
    """The job directory `kit launch` printed (its "job dir:" line), or the failure that printed none."""
    m = re.search(r"^job dir: (.+)$", proc.stdout, re.M)
    assert m, proc.stdout + proc.stderr
    return m.group(1)


def skip_where_squashfuse_is_closed(cluster, mode: str) -> None:
    """Real enroot runs squashfuse as the job's user, and libfuse opens /dev/fuse itself: on a machine whose
    /dev/fuse is root's alone (this one's is 0600; Debian's 0666) real pyxis cannot start squashfuse mode for an
    ordinary user. The stand-in makes the step's own device node: it runs everywhere."""
    if (
        mode.startswith("squashfuse")
        and cluster.state().containers == "pyxis"
        and os.stat("/dev/fuse").st_mode & 0o006 != 0o006
    ):
        pytest.skip(
            "real enroot opens /dev/fuse as the job's user, for whom this machine's is closed (Debian's is "
            "0666): real pyxis cannot start squashfuse mode for an ordinary user here"
        )


def remove_user(name: str, timeout: float = 30) -> None:
    """The user and everything of theirs gone: their processes killed and waited for (userdel refuses a user
    who still runs one: a job's last process ending just then left the user behind, silently), then userdel."""
    deadline = time.monotonic() + timeout
    while True:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False)
        gone = subprocess.run(["userdel", "--remove", name], capture_output=True, text=True)
        if gone.returncode != 8 or time.monotonic() > deadline:  # 8: a process of theirs still runs
            break
        time.sleep(0.5)
    assert gone.returncode == 0, f"userdel {name}: {gone.stderr}"


@contextlib.contextmanager
def container_scope(cluster, scope: str):
    """The session's cluster under pyxis's ``container_scope`` (each new step and job epilog reads it)."""
    before = cluster.state().container_scope
    cluster.up(container_scope=scope)
    try:
        yield
    finally:
        cluster.up(container_scope=before)


def launched(person, *args: str, command: list[str], timeout: float = 300) -> dict:
    """`kit launch --json ...` as the person, into their jobs directory; returns {job_id, job_dir, ...}."""
    proc = person.kit(
        "launch", "--json", "--output-dir", str(person.dir / "jobs"), *args, "--", *command, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[0])


NO_DEVICES = ["-wildcards", "-e", "dev/*"]  # mksquashfs: debootstrap's /dev nodes left out, /dev kept (last: -e
#                                            takes every argument after it)


@contextlib.contextmanager
def cpu_quota(pid: int, share: float):
    """Process ``pid`` (every thread, and what it forks meanwhile) held to ``share`` of one CPU in a cgroup of the
    test's own (cgroup v2's cpu.max, or v1's cpu controller); put back where it was, and the cgroup removed, after."""
    period = 100_000
    quota = max(int(period * share), 1000)
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    root = Path("/sys/fs/cgroup") if v2 else Path("/sys/fs/cgroup/cpu")
    before = next(
        line.split(":", 2)[2]
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        if (line.startswith("0::") if v2 else line.split(":")[1].split(",").count("cpu"))
    )
    group = root / f"kit-test-quota-{os.getpid()}-{pid}"
    group.mkdir()
    try:
        if v2:
            (group / "cpu.max").write_text(f"{quota} {period}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        back = root / before.lstrip("/")
        for moved in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # gone meanwhile
                (back / "cgroup.procs").write_text(moved)
        group.rmdir()


class Receiver:
    """A loopback HTTP server that keeps every POST (path, JSON body, arrival time); ``delay`` seconds before it
    answers, ``status`` its answer."""

    def __init__(self, delay: float = 0.0, status: int = 200):
        self.got: list[tuple[str, dict, float]] = []
        self.delay, self.status = delay, status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.got.append((self.path, body, time.time()))
                time.sleep(outer.delay)
                self.send_response(outer.status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self, path: str) -> list[dict]:
        return [b for p, b, _ in self.got if p == path]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
