"""kit from a laptop: kit commands run on the login node through the system's OpenSSH client,
against real sshd servers on loopback (tests/sshd.py): a login node reached through a jump host
(ProxyJump), key-only, every accepted connection counted in the servers' logs. The login account is an
ordinary user's (the session's ``user``: kit in their ~/venv, their jobs on root's local cluster), as on a
site; the site's login shell gives them SLURM_CONF (the server's SetEnv here). The laptop is this process."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, as_user, kit, require, wait_for
from sshd import SSHD, Servers

from kit import slurm

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def hosts(cluster, user, tmp_path_factory):
    require(SSHD)
    root = tmp_path_factory.mktemp("ssh")
    root.chmod(0o700)
    home = Path(user.pw_dir)
    login_env = {
        **cluster.target.env,
        "KIT_HOME": str(home / "kit-home"),
        "PATH": f"{home}/venv/bin:/usr/local/bin:/usr/bin:/bin",
    }
    servers = Servers(root, login_env, user=user).start()
    servers.home_before = files_of(home)  # the last test finds nothing else written there
    # A site's login shell greets: its dotfiles print before the command runs (bash sources ~/.bashrc for `ssh
    # host cmd`; these lines stand above Debian's interactive guard, as sites put them), a JSON-looking line too.
    bashrc = home / ".bashrc"
    dotfile = bashrc.read_text()
    bashrc.write_text(f"echo '{BANNER}'\necho '{{\"job_dir\": \"/not/kits\"}}'\n{dotfile}")
    try:
        yield servers
    finally:
        bashrc.write_text(dotfile)
        servers.stop()


BANNER = "Welcome to the login node! /home is 93% full."


def files_of(home: Path) -> set[str]:
    """What the login account's home holds, but for kit's home and the tests' output directories there."""
    return {
        str(p.relative_to(home))
        for p in home.rglob("*")
        if p.relative_to(home).parts[0] not in ("kit-home", "remote-tests")
    }


@pytest.fixture
def laptop(hosts, user):
    """The laptop's environment for kit: its ssh configuration (as ~/.ssh/config would be), kit on the login
    node found by its path (the user's venv), and no master connection left from another test."""
    hosts.close_masters()
    return {"KIT_SSH": " ".join(hosts.ssh()), "KIT_REMOTE_KIT": f"{user.pw_dir}/venv/bin/kit"}


@pytest.fixture
def there(user, request) -> Path:
    """An output directory of the test's own on the login node, the user's."""
    path = Path(user.pw_dir) / "remote-tests" / re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)
    for d in (path.parent, path):
        d.mkdir(mode=0o700, exist_ok=True)
        os.chown(d, user.pw_uid, user.pw_gid)
    return path


def submit_as(user, hosts, out: Path, *args: str, command: str) -> dict:
    """`kit launch --json` (the site's Slurm: SLURM_CONF) as the user on the login node: {job_id, job_dir, …}."""
    proc = in_the_login_shell(user, hosts, f"kit launch --json --output-dir {out} {' '.join(args)} -- {command}")
    return json.loads(proc.stdout.splitlines()[-1])


def in_the_login_shell(user, hosts, command: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``command`` run by the user in their login shell on the login node, with its environment there (its
    banner printed first: what ``command`` prints is its last lines)."""
    env = "".join(f"; export {k}={shlex.quote(v)}" for k, v in hosts.login_env.items())
    proc = as_user(user, command, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return proc


def counted(hosts, run):
    """``run()``'s result and the connections it opened: (to the login node, to the jump host)."""
    before = hosts.accepted("login"), hosts.accepted("jump")
    out = run()
    time.sleep(0.3)  # the servers' log lines
    return out, (hosts.accepted("login") - before[0], hosts.accepted("jump") - before[1])


def test_ps_logs_report_and_cancel_through_a_jump_host_one_connection_at_most(
    cluster, user, hosts, laptop, there, tmp_path
):
    job = submit_as(user, hosts, there, "--nodes", "1", command="bash -c 'echo hello from the job; sleep 300'")
    job_dir = Path(job["job_dir"])
    wait_for(
        lambda: "hello from the job" in "".join(p.read_text() for p in (job_dir / "logs").glob("rank-0*")),
        60,
        what="the job's first line",
    )
    ps, opened = counted(hosts, lambda: kit("--host", "kit-login", "ps", "--output-dir", str(there), env=laptop))
    assert ps.returncode == 0, ps.stderr
    assert job["job_id"] in ps.stdout and "RUNNING" in ps.stdout
    assert opened == (1, 1)  # the first call opens kit's master (through the jump host) and keeps it
    # The login shell's banner (printed before kit ran) is not kit's output: `ps --json` there is JSON here.
    raw = subprocess.run([*hosts.ssh(), "-T", "kit-login", "true"], capture_output=True, text=True, timeout=60)
    assert BANNER in raw.stdout, raw  # the login shell does print it
    rows = json.loads(kit("--host", "kit-login", "ps", "--json", "--output-dir", str(there), env=laptop).stdout)
    assert [r["id"] for r in rows] == [job["job_id"]] and BANNER not in ps.stdout, ps.stdout
    for args in (("logs", str(job_dir)), ("ps", "--all"), ("report", str(job_dir), "-o", str(tmp_path / "r.png"))):
        out, opened = counted(hosts, lambda: kit("--host", "kit-login", *args, env=laptop))
        assert out.returncode == 0, (args, out.stderr)
        assert opened == (0, 0), args  # the master serves every later call
    assert "hello from the job" in kit("--host", "kit-login", "logs", str(job_dir), env=laptop).stdout
    cancel = kit("--host", "kit-login", "cancel", job["job_id"], "--output-dir", str(there), env=laptop)
    assert cancel.returncode == 0, cancel.stderr
    slurm.wait(cluster.target, job["job_id"], timeout=60)
    assert slurm.job_status(cluster.target, job["job_id"]).state == "CANCELLED"


def test_kit_host_from_the_environment_and_a_command_that_runs_here(hosts, laptop, tmp_path):
    """KIT_HOST sends the login node's commands there; a command that is the laptop's (build) says so."""
    out, opened = counted(hosts, lambda: kit("ps", "--json", env={**laptop, "KIT_HOST": "kit-login"}))
    assert out.returncode == 0 and isinstance(json.loads(out.stdout), list), out.stderr
    assert opened == (1, 1)  # there, through the jump host
    here = kit("--host", "kit-login", "build", str(tmp_path / "x.toml"), env=laptop)
    assert here.returncode == 2 and "kit: --host: kit build runs here" in here.stderr, here.stderr


def test_reuse_only_needs_a_master_and_names_the_command_that_starts_one(hosts, laptop):
    env = {**laptop, "KIT_SSH_REUSE_ONLY": "1"}
    (out, opened) = counted(hosts, lambda: kit("--host", "kit-login", "ps", env=env))
    assert out.returncode == 1 and opened == (0, 0), out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0] == "kit: --host: no SSH master connection to kit-login to reuse (KIT_SSH_REUSE_ONLY)", lines
    start = re.search(r"start one .*: (ssh -F \S+ -fNM -o 'ControlPath=~/.ssh/kit-[0-9a-f]{24}' kit-login)$", lines[1])
    assert start, lines
    subprocess.run(start.group(1), shell=True, check=True, timeout=30)  # as the user would (their 2FA, once)
    for _ in range(3):
        out, opened = counted(hosts, lambda: kit("--host", "kit-login", "ps", env=env))
        assert out.returncode == 0 and opened == (0, 0), out.stderr


def test_a_changed_host_key_is_refused_and_nothing_runs(hosts, laptop):
    """Refused even while a master to the same host, port and user is up under another alias (with ssh's
    ``%C`` for a socket, kit-moved reused kit-direct's master: the key was never checked)."""
    assert kit("--host", "kit-direct", "ps", env=laptop).returncode == 0
    assert hosts.master_pid("kit-direct")
    out, opened = counted(hosts, lambda: kit("--host", "kit-moved", "ps", env=laptop))
    assert out.returncode == 1 and opened == (0, 0), out.stderr
    assert "kit: --host: ssh refused kit-moved: its host key is not the one known for it" in out.stderr


def test_two_sites_behind_their_own_bastions_under_one_internal_name_never_share_a_master(hosts, laptop):
    """site-a and site-b are both ``login.internal``, port 22, the same user — each reached through its own
    bastion (A's is the login sshd, B's the jump sshd). Each gets its own master, so each command runs at the
    site it names (with ssh's ``%C`` for a socket, site-b's commands ran on site A, 4 of 4). The site is told
    by the server that accepted the connection; `kit logs` of no job writes nothing at either."""
    for name, opens in (("site-a", (1, 0)), ("site-b", (0, 1))):
        for expected in (opens, (0, 0)):  # the master, then its reuse
            out, opened = counted(hosts, lambda: kit("--host", name, "logs", "/no/such/job", env=laptop))
            assert out.returncode not in (0, 255) and "/no/such/job" in out.stderr, out.stderr
            assert opened == expected, (name, opened, out.stderr)
    assert None not in {hosts.master_pid("site-a"), hosts.master_pid("site-b")}
    assert hosts.master_pid("site-a") != hosts.master_pid("site-b")


def test_kit_missing_there_or_of_another_version_is_refused_in_one_line(hosts, laptop):
    missing = kit("--host", "kit-direct", "ps", env={**laptop, "KIT_REMOTE_KIT": "/nonexistent/kit"})
    assert missing.returncode == 1, missing.stderr
    assert missing.stderr.startswith("kit: --host: kit is not installed on kit-direct"), missing.stderr
    assert "hint: install it there: pip install kit-slurm==" in missing.stderr
    other = kit(
        "--host",
        "kit-direct",
        "ps",
        env={**laptop, "KIT_REMOTE_KIT": f"env KIT_CLIENT_VERSION=0.0.1 {laptop['KIT_REMOTE_KIT']}"},
    )
    # Read on the laptop: "here" is the laptop (0.0.1, as the login node was told), "there" the login node.
    assert other.returncode == 2 and re.search(
        r"kit: --host: kit 0\.0\.1 here, kit \S+ on the login node\n"
        r"hint: use one version on both: .*==\S+ here, or .*==0\.0\.1 on "
        r"the login node",
        other.stderr,
    ), other.stderr
    # A KIT_HOST in the login node's own environment (dotfiles shared with the laptop): the command runs there,
    # never on to another host (which would be itself, again and again).
    relayed = kit(
        "--host",
        "kit-direct",
        "ps",
        "--output-dir",
        "/nonexistent/kit-jobs",
        env={**laptop, "KIT_REMOTE_KIT": f"env KIT_HOST=kit-direct {laptop['KIT_REMOTE_KIT']}"},
    )
    assert relayed.returncode == 0 and "kit-direct" not in relayed.stderr, relayed.stdout + relayed.stderr


def test_logs_follow_streams_and_a_client_that_goes_away_leaves_nothing_there(cluster, user, hosts, laptop, there):
    job = submit_as(
        user, hosts, there, "--nodes", "1", command="bash -c 'for i in $(seq 1 200); do echo line $i; sleep 0.1; done'"
    )
    follow = subprocess.Popen(
        [sys.executable, "-m", "kit", "--host", "kit-login", "logs", "-f", job["job_dir"]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **laptop},
        start_new_session=True,
    )

    def left():
        """The user's kit processes on the login node serving the follow (its command line is `kit remote-args`)."""
        ps = subprocess.run(
            ["pgrep", "-u", str(user.pw_uid), "-f", "kit (logs -f|remote-)"], capture_output=True, text=True
        )
        return ps.stdout.split()

    seen = []
    for line in follow.stdout:
        seen.append(line)
        if "line 20" in line:
            break
    assert left(), "the login node's side of the follow is not found while it follows"
    os.killpg(follow.pid, signal.SIGKILL)  # the laptop's side dies (a closed lid)
    follow.wait()
    assert any("line 1" in s for s in seen)

    wait_for(lambda: not left(), 30, what="the login node's kit logs -f to end")
    subprocess.run(["scancel", job["job_id"]], env={**os.environ, **cluster.target.env}, check=False)


def test_ui_on_the_login_node_is_served_here_through_the_master_and_ends_with_ctrl_c(
    cluster, user, hosts, laptop, there
):
    """`kit --host kit-login ui`: kit ui runs there (as the user), its port forwarded through kit's master: the
    address printed here holds its token, the list shows the job there, a request without the token gets 403, and
    Ctrl-C here ends it there."""
    import http.cookiejar
    import urllib.error
    import urllib.request

    job = submit_as(user, hosts, there, "--nodes", "1", command="bash -c 'echo hello; sleep 300'")
    # As at a terminal: SIGINT as the default (a suite started in the background from a script inherits it
    # ignored, and Python then has no KeyboardInterrupt to raise).
    ui = subprocess.Popen(
        [sys.executable, "-m", "kit", "--host", "kit-login", "ui", "--output-dir", str(there)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **laptop},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip

    def left():
        ps = subprocess.run(
            ["pgrep", "-u", str(user.pw_uid), "-f", "kit (ui|remote-args)"], capture_output=True, text=True
        )
        return ps.stdout.split()

    try:
        address = ui.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]+", address), (address, ui.stderr.read())
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        page = browser.open(address, timeout=30).read().decode()
        assert f'href="/job/{job["job_id"]}"' in page and BANNER not in page, page
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(address.split("?")[0], timeout=30)
        assert refused.value.code == 403
        assert left(), "kit ui runs on the login node"
    finally:
        ui.send_signal(signal.SIGINT)
        assert ui.wait(timeout=30) == 0, ui.stderr.read()
        subprocess.run(["scancel", job["job_id"]], env={**os.environ, **cluster.target.env}, check=False)
    wait_for(lambda: not left(), 30, what="kit ui on the login node to end")


def test_logs_follow_rides_through_a_dropped_connection_without_a_line_twice(cluster, user, hosts, laptop, there):
    """The master connection is killed mid-follow (a network drop): kit connects again and the log goes on
    from where it was — every line once, in order, to the job's end."""
    job = submit_as(
        user, hosts, there, "--nodes", "1", command="bash -c 'for i in $(seq 1 80); do echo line $i; sleep 0.1; done'"
    )
    before = hosts.accepted("login")
    follow = subprocess.Popen(
        [sys.executable, "-m", "kit", "--host", "kit-login", "logs", "-f", job["job_dir"]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **laptop},
    )
    lines = []
    for line in follow.stdout:
        lines.append(line)
        if "line 30" in line:
            break
    os.kill(hosts.master_pid("kit-login"), signal.SIGKILL)
    lines += follow.stdout.readlines()
    assert follow.wait(120) == 0, follow.stderr.read()
    numbered = [int(m.group(1)) for line in lines if (m := re.search(r"line (\d+)$", line.rstrip()))]
    assert numbered == list(range(1, 81)), numbered
    assert hosts.accepted("login") - before == 2  # the first master, and the one after the drop


def test_launch_sends_the_code_as_the_objects_the_login_node_lacks(cluster, hosts, laptop, there, tmp_path):
    """A laptop's git work tree launched through the jump host: the first launch sends every file, an unchanged
    tree none, a one-file edit that file; the job runs the laptop's code from the directory that stands for the
    laptop's; nothing of the laptop's environment reaches it but what --env names."""
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "train.py").write_text(
        "import os\nprint('code version 1', open('../data.txt').read().strip(), "
        "os.environ.get('LAPTOP_SECRET'), os.environ.get('TOKEN'), flush=True)\n"
    )
    (repo / "data.txt").write_text("tracked data\n")
    (repo / "README").write_text("a user's repository\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.email=u@x", "-c", "user.name=u", "commit", "-qm", "one"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    env = {**laptop, "KIT_HOME": str(tmp_path / "laptop-home"), "LAPTOP_SECRET": "from-the-laptop-shell"}
    out_dir = there

    def launch():
        return counted(
            hosts,
            lambda: kit(
                "--host",
                "kit-login",
                "launch",
                "--nodes",
                "1",
                "--wait",
                "--output-dir",
                str(out_dir),
                "--env",
                "TOKEN=t0ken",
                "--",
                "python3",
                "train.py",
                env=env,
                cwd=repo / "src",
                timeout=180,
            ),
        )

    def sent(proc) -> int:
        return int(re.search(r"kit: code sha256:\S+: sent (\d+) object\(s\)", proc.stderr).group(1))

    first, opened = launch()
    assert first.returncode == 0, first.stderr
    assert sent(first) == 3 and opened == (1, 1), (first.stderr, opened)
    job_dir = Path(re.search(r"job dir: (\S+)", first.stdout).group(1))
    assert job_dir.parent == out_dir and not job_dir.stat().st_mode & 0o077
    log = "".join(p.read_text() for p in (job_dir / "logs").glob("rank-0*"))
    assert "code version 1 tracked data None t0ken" in log, log
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    recorded = json.loads((job_dir / "job.json").read_text())["snapshot"]
    assert (recorded["commit"], recorded["dirty"], recorded["files"]) == (head, False, 3), recorded
    again, opened = launch()
    assert again.returncode == 0 and sent(again) == 0 and opened == (0, 0), again.stderr
    (repo / "src" / "train.py").write_text((repo / "src" / "train.py").read_text().replace("version 1", "version 2"))
    edited, _ = launch()
    assert edited.returncode == 0 and sent(edited) == 1, edited.stderr
    job_dir = Path(re.search(r"job dir: (\S+)", edited.stdout).group(1))
    assert "code version 2" in "".join(p.read_text() for p in (job_dir / "logs").glob("rank-0*"))
    # On the login node: the store and the trees under the user's KIT_HOME, the jobs in their output directory.
    home = Path(hosts.login_env["KIT_HOME"])
    [tree] = list((home / "trees").iterdir())
    assert len(list(tree.iterdir())) == 2  # one per content the laptop sent


def test_bench_remote_quick(tmp_path):
    """bench/bench_remote.py --quick with its own 1-node cluster and login sshd: every line printed, and an
    unchanged repository sends no object the second time. (What SSH adds to a call is measured on one account
    against itself: the login node's calls here and there are the bench's own, not this module's user's.)"""
    env = {k: v for k, v in os.environ.items() if k not in ("KIT_SSH", "KIT_REMOTE_KIT", "KIT_HOST")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_remote.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "KIT_HOME": str(tmp_path / "bench-home")},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for call in ("launch --dry-run", "launch", "ps"):
        assert re.search(rf"^{re.escape(call)} +\d+\.\d+s +\d+\.\d+s +\d+\.\d+s +\+", proc.stdout, re.M), proc.stdout
    assert re.search(r"unchanged \d+\.\d+ s \(0 objects", proc.stdout), proc.stdout


LAPTOP = """
import json, os, sys, time
from pathlib import Path
import kit
from kit.remote import client
from kit.job import functions
def add_nodes(a, b):
    return a + b + int(os.environ["SLURM_NNODES"])

def fails():
    raise ValueError("raised on the cluster")

def square(x):
    return x * x

out, got = sys.argv[1], {}
job = kit.submit(add_nodes, 2, 3, host="kit-login", nodes=1, output_dir=out + "/fn")
got["parent"], got["value"] = str(Path(job.dir).parent), job.result(timeout=120)
got["classes"] = [type(job) is kit.FunctionJob, type(kit.FunctionJob(job.dir, host="kit-login", job_id=job.id))
                  is kit.FunctionJob, kit.FunctionJob(job.dir, host="kit-login", job_id=job.id).result()]
failing = kit.submit(fails, host="kit-login", output_dir=out + "/fn")
try:
    failing.result(timeout=120)
except kit.RemoteError as e:
    got["raised"] = [e.type, str(e)]
tasks = kit.map(square, [2, 3, 4], host="kit-login", output_dir=out + "/fn")
got["ids"] = [t.id.split("_")[1] for t in tasks]
while not all(t.done() for t in tasks):
    time.sleep(0.5)
calls, session = [], client.Session
client.Session = lambda host, argv: calls.append(json.loads(argv[-1])["call"] if argv[1:] else argv[0]) or session(host, argv)
got["results"], got["calls"] = [t.result(timeout=120) for t in tasks], list(calls)
got["again"], got["calls_after"] = [t.result() for t in tasks], len(calls)
functions.PYTHON = "3.99"
try:
    kit.submit(add_nodes, 1, 2, host="kit-login", output_dir=out + "/refused")
except kit.KitError as e:
    got["refused"] = str(e)
print(json.dumps(got))
"""


def on_the_laptop(user, laptop, cwd: Path, script: Path, *args: str):
    """The JSON that ``script`` prints last, run here as the laptop: the user's venv's Python (a function job's
    Python is the login node's minor), the laptop's ssh configuration, a kit home of its own."""
    proc = subprocess.run(
        [f"{user.pw_dir}/venv/bin/python3", str(script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**os.environ, **laptop, "KIT_HOME": str(cwd / "laptop-home")},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_function_submitted_from_the_laptop_brings_its_value_back(cluster, user, hosts, laptop, there, tmp_path):
    """kit.submit(fn, host=...) and kit.map: pickled here, run on the cluster, the values (or a remote exception)
    back here through the master; a Python of another minor version there is refused before anything is sent.
    The laptop's Python is the login node's minor version (its function runs there): the user's venv's, run
    here by this process, its functions those of its __main__."""
    script = tmp_path / "laptop.py"
    script.write_text(LAPTOP)
    before = hosts.accepted("login")
    got = on_the_laptop(user, laptop, tmp_path, script, str(there))
    assert got["parent"] == str(there / "fn") and got["value"] == 6, got
    assert got["classes"] == [True, True, 6], got  # kit.FunctionJob itself, here or reopened
    assert got["raised"][0] == "ValueError" and "raised on the cluster" in got["raised"][1], got
    assert got["ids"] == ["0", "1", "2"], got  # one array job, a task per item
    assert got["results"] == [4, 9, 16] and got["calls"] == ["results"], got  # one call: every task's value
    assert got["again"] == [4, 9, 16] and got["calls_after"] == 1, got  # each read once
    assert re.search(r"is 3\.\d+, this one is 3\.99", got["refused"]), got
    assert hosts.accepted("login") - before <= 1  # one master for every call
    assert not (there / "refused").exists()


def _kill_master(hosts) -> None:
    os.kill(hosts.master_pid("kit-login"), signal.SIGKILL)


def _wait_through_a_killed_master(hosts, repo: Path, env: dict, *args: str) -> tuple[int, str]:
    """`kit --host kit-login launch --wait ARGS` from ``repo``, the master killed once the job is
    submitted: (its exit code, its stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kit", "--host", "kit-login", "launch", "--wait", *args],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    submitted = proc.stdout.readline()
    assert submitted.startswith("Submitted job "), submitted + proc.stderr.read()
    # Once both lines are here (the id, then the directory): a drop between them is another matter (today the
    # launch then says ssh could not reach the host while the job runs; seen here once the login side was
    # an ordinary user's slower Python), not this test's.
    where = proc.stdout.readline()
    assert where.startswith("job dir: "), where + proc.stderr.read()
    _kill_master(hosts)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


API_CASES = """
import json, os, sys, time
import kit
import kit.slurm
host, out = sys.argv[1] or None, sys.argv[2]

def square(x):
    return x * x

job = kit.launch(["bash", "-c", "echo one; echo token=$TOKEN; echo two"], host=host, nodes=1, output_dir=out,
                 env={"TOKEN": "s3cret"}, no_code_snapshot=True, wait=True)
fed, followed = [], []
job.feed_logs(fed.append, rank=0)
ended = job.follow(followed.append)
listed = [j for j in kit.jobs(host=host, output_dirs=[out]) if str(j.dir).startswith(out)]  # (and jobs known)
reopened = kit.Job(job.dir, host=host)
from_dir = kit.Job.from_dir(job.dir, host=host)
reported, summary = job.report(), job.summarize()
again = job.rerun(wait=True, env={"TOKEN": "r3run"})
fn = kit.submit(square, 7, host=host, nodes=1, output_dir=out)
tasks = kit.map(square, [2, 3], host=host, output_dir=out)
long = kit.launch("sleep 300", host=host, output_dir=out, no_code_snapshot=True)
deadline = time.monotonic() + 120
while long.state() not in ("RUNNING", *kit.slurm.TERMINAL_STATES) and time.monotonic() < deadline:
    time.sleep(0.2)
cancelled = long.cancel(reason="enough")
try:
    kit.Job(os.path.join(out, "nothing"), host=host).state()
except kit.KitError as e:
    missing = str(e).replace(out, "OUT")
print(json.dumps({
    "classes": [type(j).__name__ for j in (job, reopened, again, fn, *tasks, *listed)],
    "where": [os.path.dirname(j.dir) == out for j in (job, again, fn)] + [str(t.dir).startswith(out + "/") for t in tasks],
    "state": [job.state(), job.done(), job.wait(timeout=60).exit_code, reopened.state(), ended],
    "logs": [job.logs(), job.logs(rank=0), b"".join(fed).decode(), b"token=s3cret" in b"".join(followed)],
    "errors": [job.logs(errors=True), job.errors(), repr(job.progress())],
    "events": [e.kind for e in job.events()],
    "goodput": (lambda g: [g.runs, g.goodput, g.live, g.parts["unreported"] > 0, type(g).__name__,
                           abs(sum(g.parts.values()) - g.wall_seconds) < 1e-6])(job.goodput()),
    "listed": [[j.id, str(j.dir), j.row.state] for j in listed] == [[job.id, str(job.dir), "COMPLETED"]],
    "rerun": [again.id != job.id, again.logs(rank=0)],
    "target": [job.target.name, again.target.name],
    "results": [fn.result(timeout=120), [t.result(timeout=120) for t in tasks], [t.id[-2:] for t in tasks],
                fn.results()],
    "cancel": [cancelled["reason"], long.wait(timeout=120).state],
    "missing": missing,
    "report": [reported["job"] == job.id, reported["runs"], reported["samples"], bool(summary.lines()),
               str(from_dir.dir) == str(job.dir)],
}))
"""

# What every case of API_CASES answers, wherever the calls are made.
API_ANSWERS = {
    "classes": ["Job", "Job", "Job", "FunctionJob", "FunctionJob", "FunctionJob", "Job"],
    "where": [True] * 5,
    "state": ["COMPLETED", True, 0, "COMPLETED", "COMPLETED"],
    "logs": ["0: one\n0: token=s3cret\n0: two\n", "one\ntoken=s3cret\ntwo\n", "one\ntoken=s3cret\ntwo\n", True],
    "errors": [
        "",
        [],
        "Progress(step=None, max_steps=None, loss=None, samples_per_second=None, tflops=None, mfu=None)",
    ],
    "events": ["submitted", "started", "running", "run-ended", "exited", "ended"],
    "goodput": [1, None, False, True, "Goodput", True],  # a bash command reports no steps: its time unreported
    "listed": True,
    "rerun": [True, "one\ntoken=r3run\ntwo\n"],
    "target": ["site", "site"],
    "results": [49, [4, 9], ["_0", "_1"], [49]],
    "cancel": ["enough", "CANCELLED"],
    "missing": "no such job directory: OUT/nothing",
    "report": [True, 1, None, True, True],
}


def test_the_api_cases_call_every_public_method_of_a_job():
    """The walk: every public method of kit.Job and kit.FunctionJob (found on the classes, not listed by hand) is
    called by API_CASES, which the test below runs on the login node and from the laptop over a real sshd; and
    every call a job on a login node may make is in the one registry both sides read."""
    import inspect

    import kit
    from kit.job import hosting

    public = {
        name
        for cls in (kit.Job, kit.FunctionJob)
        for name, _ in inspect.getmembers(cls, callable)
        if not name.startswith("_")
    }
    assert len(public) >= 15 and sorted(n for n in public if f".{n}(" not in API_CASES) == []
    local_only = {"done", "from_dir", "result"}  # each made of hosted ones (state, the constructor, results)
    assert sorted(public - local_only - set(hosting.CALLS)) == [], "a public method no login node answers"


@pytest.mark.parametrize("where", ["on-the-login-node", "from-the-laptop"])
def test_the_python_api_answers_alike_on_the_login_node_and_over_ssh(cluster, user, hosts, laptop, there, where):
    """The same calls — kit.launch, a Job's state/done/wait/logs/feed_logs/follow/errors/progress/goodput/events/target/
    rerun/cancel, kit.jobs, kit.Job reopened, kit.submit and kit.map with their results — made by the user on the login
    node (no host) and from the laptop (host="kit-login"), give the same answers: kit.Job and kit.FunctionJob
    both ways. The laptop runs the user's venv's Python (a function job's Python is the login node's minor)."""
    script = there / "api_cases.py"
    script.write_text(API_CASES)
    out = str(there / "jobs")
    if where == "on-the-login-node":
        os.chown(script, user.pw_uid, user.pw_gid)
        got = json.loads(
            in_the_login_shell(user, hosts, f"python3 {script} '' {out}", timeout=600).stdout.splitlines()[-1]
        )
    else:
        got = on_the_laptop(user, laptop, there, script, "kit-login", out)
    assert got == API_ANSWERS


def test_python_launch_of_a_work_tree_a_report_and_a_dry_run_through_one_master(
    cluster, user, hosts, laptop, there, tmp_path, monkeypatch
):
    """kit.launch(..., host=) of a git work tree's code, a report's picture brought here, a dry run and
    `kit --host launch` all through one master, no argument on the login node's command lines; a wait rides
    through a killed master; a bad keyword is refused here, before any connection."""
    import threading

    import kit as kitlib

    for key, value in laptop.items():
        monkeypatch.setenv(key, value)
    # kit there through a wrapper that records its command line (what the login node's ps shows)
    seen = there / "argv-there"
    wrapper = there / "kit-there"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {seen}\nexec {laptop["KIT_REMOTE_KIT"]} "$@"\n')
    wrapper.chmod(0o755)
    os.chown(wrapper, user.pw_uid, user.pw_gid)
    monkeypatch.setenv("KIT_REMOTE_KIT", str(wrapper))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "job.sh").write_text("echo one; echo token=$TOKEN; sleep 3; echo two\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.email=u@x", "-c", "user.name=u", "commit", "-qm", "one"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    monkeypatch.chdir(repo)
    out = str(there / "jobs")
    with pytest.raises(kitlib.KitError, match="unknown option 'nodez'"):
        kitlib.launch(["true"], host="kit-login", nodez=2)
    before = hosts.accepted("login")
    job = kitlib.launch(
        ["bash", "job.sh"], host="kit-login", nodes=1, output_dir=out, env={"TOKEN": "s3cret"}, wait=True
    )
    # (Every method's answer against the login node's own: test_the_python_api_answers_alike_….)
    assert type(job) is kitlib.Job and job.host.name == "kit-login" and job.id and job.dir.parent == Path(out)
    assert job.state() == "COMPLETED" and "0: token=s3cret" in job.logs()
    reopened = kitlib.Job(job.dir, host="kit-login", job_id=job.id)
    numbers = reopened.report(output=tmp_path / "report.png")
    assert (
        numbers["job"] == job.id
        and (tmp_path / "report.png").read_bytes() == (Path(job.dir) / "report.png").read_bytes()
    )
    plain = subprocess.run(
        [
            sys.executable,
            "-m",
            "kit",
            "--host",
            "kit-login",
            "launch",
            "--wait",
            "--no-code-snapshot",
            "--output-dir",
            out,
            "--env",
            "TOKEN=n0snap",
            "--",
            "bash",
            "-c",
            "echo token=$TOKEN",
        ],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=300,
    )
    assert plain.returncode == 0 and "Submitted job" in plain.stdout, plain.stdout + plain.stderr
    assert "0: token=n0snap" in kitlib.Job(plain.stdout.split("job dir: ")[1].split()[0], host="kit-login").logs()
    # Every call's arguments came in the channel: the login node's command lines (its `ps`) held none of them.
    assert set(seen.read_text().splitlines()) == {"remote-args"}
    dry = kitlib.launch("true", host="kit-login", dry_run=True, output_dir=out)
    assert dry.id is None and (Path(dry.dir) / "prelaunch.sh").is_file()
    assert hosts.accepted("login") - before == 1  # every call above through one master
    long = kitlib.launch("echo up; sleep 300", host="kit-login", output_dir=out)
    wait_for(lambda: long.state() == "RUNNING", 60, what="the long job running")
    ended = []
    waiter = threading.Thread(target=lambda: ended.append(long.wait(timeout=180)), daemon=True)
    waiter.start()
    time.sleep(1)
    _kill_master(hosts)
    record = long.cancel(reason="from the laptop")
    assert record["reason"] == "from the laptop"
    waiter.join(120)
    assert ended and ended[0].state == "CANCELLED", ended


def test_launch_wait_rides_through_a_dropped_master(cluster, hosts, laptop, there, tmp_path):
    """The master is killed while `kit --host … launch --wait` waits: kit connects again, waits for the same job
    (never launching it twice) and exits with its code."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "job.sh").write_text("echo started; sleep 12; echo done\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.email=u@x", "-c", "user.name=u", "commit", "-qm", "one"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    before = hosts.accepted("login")
    code, err = _wait_through_a_killed_master(
        hosts,
        repo,
        {**laptop, "KIT_HOME": str(tmp_path / "laptop-home")},
        "--output-dir",
        str(there),
        "--",
        "bash",
        "job.sh",
    )
    assert code == 0, err
    assert "the connection to kit-login dropped; waiting again" in err and "ended COMPLETED" in err, err
    assert len(list(there.iterdir())) == 1  # launched once
    assert hosts.accepted("login") - before == 2


def test_the_main_job_and_a_sweep_from_the_laptop_through_the_jump_host(
    cluster, cpu_image, hosts, laptop, there, tmp_path
):
    """The README's main job (2 nodes in kit's image, metrics, report) and a sweep, launched from a laptop's
    repository through ProxyJump, then reported from there."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.txt").write_text("a user's repository\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.email=u@x", "-c", "user.name=u", "commit", "-qm", "one"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    env = {**laptop, "KIT_HOME": str(tmp_path / "laptop-home")}
    image = tmp_path / "laptop-image.sqsh"  # the laptop's own build: content no pinned copy there has yet
    shutil.copyfile(cpu_image, image)
    with open(image, "ab") as f:
        f.write(b"\0" * 4096)  # past the filesystem's end: unread, but another digest
    main = kit(
        "--host",
        "kit-login",
        "launch",
        "--nodes",
        "2",
        "--image",
        str(image),
        "--wait",
        "--output-dir",
        str(there),
        "--",
        "python3",
        "-m",
        "kit.train",
        "--max-steps",
        "30",
        "--step-delay",
        "0.05",
        env=env,
        cwd=repo,
        timeout=300,
    )
    assert main.returncode == 0, main.stderr
    assert re.search(r"^kit: image sha256:\S+: sent \d+\.\d MiB$", main.stderr, re.M), main.stderr
    pinned = json.loads((Path(re.search(r"^job dir: (.+)$", main.stdout, re.M).group(1)) / "job.json").read_text())
    assert Path(pinned["image"]).parent == Path(hosts.login_env["KIT_HOME"]) / "images", pinned["image"]
    again = kit(
        "--host",
        "kit-login",
        "launch",
        "--dry-run",
        "--image",
        str(image),
        "--output-dir",
        str(there),
        "--",
        "true",
        env=env,
        cwd=repo,
    )
    assert again.returncode == 0 and re.search(r"^kit: image sha256:\S+: already there$", again.stderr, re.M), (
        again.stderr
    )
    job_dir = re.search(r"^job dir: (.+)$", main.stdout, re.M).group(1)
    report = kit("--host", "kit-login", "report", job_dir, "-o", str(tmp_path / "report.png"), env=env)
    assert report.returncode == 0 and "nodes" in report.stdout.lower(), report.stderr
    # made there (in the job directory), its picture and numbers written here
    assert (tmp_path / "report.png").read_bytes() == (Path(job_dir) / "report.png").read_bytes()
    assert json.loads((tmp_path / "report.json").read_text())["job"] == main.stdout.split()[2]  # Submitted job ID
    # without -o the picture stays there, and the path printed says whose it is
    there_report = kit("--host", "kit-login", "report", job_dir, env=env)
    assert there_report.returncode == 0, there_report.stderr
    assert there_report.stdout.splitlines()[-1] == (
        f"report: {Path(job_dir) / 'report.png'} (on the login node {socket.gethostname()}; -o FILE writes the "
        "picture on your machine)"
    ), there_report.stdout
    # a sweep's --wait, its master killed while it waits: it waits again for every task there
    code, err = _wait_through_a_killed_master(
        hosts,
        repo,
        env,
        "--sweep",
        "x=1,2",
        "--output-dir",
        str(there),
        "--",
        "bash",
        "-c",
        "echo sweep x={x}; sleep 8",
    )
    assert code == 0, err
    assert "dropped; waiting again" in err and "2 of 2 task(s) finished" in err, err
    assert len(re.findall(r"kit: job \S+_\d \(x=\d\) ended COMPLETED", err)) == 2, err


def test_zz_nothing_was_written_on_the_login_node_outside_kit_home_and_the_output_directories(hosts, user, laptop):
    """After every call above (launches, a function job, logs, ps, report, cancel): the login account's home
    holds what it held before (kit's store, trees and pinned images are under $KIT_HOME; the jobs under the
    output directories the calls named)."""
    made = kit("--host", "kit-direct", "ps", env=laptop)  # the session's HOME is that home
    assert made.returncode == 0, made.stderr
    assert files_of(Path(user.pw_dir)) - hosts.home_before == set()


@pytest.mark.parametrize("answer", [{"tasks": {}}, {"tasks": []}, {"tasks": {"5": "x"}}, {"results": "x"}, {}])
def test_a_login_side_answer_without_the_result_is_one_message(monkeypatch, tmp_path, answer):
    """A login node's answer to FunctionJob.result() that holds no result of this job (`{"tasks": {}}`: an
    AttributeError traceback) is one message naming the job."""
    from kit.errors import KitError
    from kit.job import functions

    class There:
        name = "kit-login"

        def call(self, name, job, args):
            return answer

    job = functions.FunctionJob(str(tmp_path), job_id="5", there=There())
    with pytest.raises(KitError) as e:
        job.result()
    assert "holds no result of job 5" in str(e.value)
