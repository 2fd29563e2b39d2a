"""kit from a laptop to a login node where the account is an ordinary user's, set up as the README's "The login
node's side" says and nothing more: Debian's dotfiles (~/.bashrc returns early when not interactive) with the
README's line above the guard, kit in ~/venv, a key in the user's own ~/.ssh/authorized_keys, no environment from
the server (no SLURM_CONF: kit finds root's local cluster of the machine, as a site's login node has its Slurm).
The laptop is this test process (root here, as a laptop's user is their own laptop's); the jobs are the user's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, require
from sshd import SSHD, Servers

pytestmark = pytest.mark.cluster

README_LINE = re.compile(
    r"# at the top of ~/\.bashrc, above its interactive guard \(kit's line for --host\):\n\s+(.+)\n"
)


@pytest.fixture(scope="module")
def login(cluster, user, tmp_path_factory):
    """sshd on loopback whose login account is ``user``, with nothing set by the server."""
    require(SSHD)
    root = tmp_path_factory.mktemp("ssh-user")
    root.chmod(0o700)
    servers = Servers(root, {}, user=user).start()
    yield servers
    servers.stop()


def laptop(login, tmp_path: Path) -> dict:
    """The laptop's environment: its ssh configuration, its own KIT_HOME; no KIT_REMOTE_KIT (kit is the login
    shell's `kit`) and nothing of the cluster."""
    env = {k: v for k, v in os.environ.items() if k not in ("KIT_REMOTE_KIT", "KIT_HOST", "SLURM_CONF")}
    return {**env, "KIT_SSH": " ".join(login.ssh()), "KIT_HOME": str(tmp_path / "laptop-home")}


def kit_here(*args: str, env: dict, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kit", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )


def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("import os\nprint('rank', os.environ['RANK'], 'uid', os.getuid(), flush=True)\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.email=u@x", "-c", "user.name=u", "commit", "-qm", "one"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    return repo


@pytest.mark.machine_wide  # finds root's newest cluster itself: alone (tests/conftest.py)
def test_an_ordinary_login_account_set_up_as_the_readme_says(cluster, user, login, tmp_path):
    """Before the README's line: kit is in ~/venv but not on the non-interactive shell's PATH, and kit says
    so, where it is and what to change (not "not installed"). With the line above Debian's guard: a launch
    from the laptop's repository runs as the user (their uid on every rank, their ~/kit-jobs), `kit ps`,
    `kit logs` and a cancel work, and kit.launch(host=) returns the same job's answers."""
    bashrc = Path(user.pw_dir) / ".bashrc"
    debian = bashrc.read_text()
    assert "*i*) ;;" in debian and "return" in debian  # Debian's guard: the rest is for interactive shells
    env = laptop(login, tmp_path)
    repo = repository(tmp_path)
    # The README's ordinary-user line installs kit in ~/kit-venv: found there (the search looked in ~/venv,
    # ~/.venv and ~/.local/bin only), told first.
    readme = Path(user.pw_dir) / "kit-venv"
    readme.symlink_to(Path(user.pw_dir) / "venv")
    os.lchown(readme, user.pw_uid, user.pw_gid)
    try:
        found = kit_here("--host", "kit-direct", "ps", env=env, cwd=repo)
    finally:
        readme.unlink()
    kit_path = f"{user.pw_dir}/kit-venv/bin/kit"
    assert found.returncode == 1, found.stderr
    assert found.stderr.splitlines()[0] == (
        f"kit: --host: kit is not on the login shell's PATH on kit-direct, but installed at {kit_path}"
    ), found.stderr
    assert "above that line" in found.stderr and f"KIT_REMOTE_KIT={kit_path}" in found.stderr, found.stderr
    # Nowhere it looks: it says where it looked.
    missing = kit_here("--host", "kit-direct", "ps", env={**env, "KIT_REMOTE_KIT": "kit-nowhere"}, cwd=repo)
    assert missing.returncode == 1 and missing.stderr.splitlines()[0] == (
        "kit: --host: kit is not installed on kit-direct (kit-nowhere: not on the login shell's PATH, nor in "
        "~/kit-venv/bin, ~/venv/bin, ~/.venv/bin, ~/.local/bin)"
    ), missing.stderr

    line = README_LINE.search((REPO / "docs" / "remote.md").read_text()).group(1)
    bashrc.write_text(line + "\n" + debian)  # the user's file, written in place: still theirs
    assert bashrc.stat().st_uid == user.pw_uid
    launched = kit_here(
        "--host",
        "kit-direct",
        "launch",
        "--nodes",
        "2",
        "--wait",
        "--no-exporter",
        "--",
        "python3",
        "train.py",
        env=env,
        cwd=repo,
    )
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "using this machine's local cluster" in launched.stderr, launched.stderr
    job_id = re.search(r"^Submitted job (\S+)$", launched.stdout, re.M).group(1)
    job_dir = Path(re.search(r"^job dir: (.+)$", launched.stdout, re.M).group(1))
    assert job_dir.parent == Path(user.pw_dir) / "kit-jobs" and job_dir.stat().st_uid == user.pw_uid, job_dir
    logs = kit_here("--host", "kit-direct", "logs", job_id, env=env, cwd=repo)
    assert sorted(line for line in logs.stdout.splitlines() if " uid " in line) == [
        f"0: rank 0 uid {user.pw_uid}",
        f"1: rank 1 uid {user.pw_uid}",
    ], logs.stdout + logs.stderr
    ps = kit_here("--host", "kit-direct", "ps", "--json", env=env, cwd=repo)
    assert {r["id"]: r["state"] for r in json.loads(ps.stdout)}.get(job_id) == "COMPLETED", ps.stdout + ps.stderr

    running = kit_here(
        "--host",
        "kit-direct",
        "launch",
        "--nodes",
        "1",
        "--no-exporter",
        "--",
        "bash",
        "-c",
        "echo started; sleep 300",
        env=env,
        cwd=repo,
    )
    assert running.returncode == 0, running.stderr
    other = re.search(r"^Submitted job (\S+)$", running.stdout, re.M).group(1)
    probe = (
        f"import kit, json; j = kit.Job({other!r}, host='kit-direct'); j.cancel(); j.wait(timeout=120); "
        "print(json.dumps([j.state(), kit.Job(" + repr(job_id) + ", host='kit-direct').state()]))"
    )
    states = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=repo, timeout=180
    )
    assert states.returncode == 0, states.stderr
    assert json.loads(states.stdout.splitlines()[-1]) == ["CANCELLED", "COMPLETED"], states.stdout
