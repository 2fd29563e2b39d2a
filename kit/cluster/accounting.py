"""The local cluster's accounting: Debian's ``slurmdbd`` on a MariaDB of the cluster's own, so
``sacct``, ``sreport``, ``seff`` and sacct-based tools (submitit) answer as on a site.

The database lives in ``<cluster>/accounting`` (0700): its data directory, kept across
``down``/``up`` (a job's record outlives the daemons, as on a site), and its socket — MariaDB
listens on no port at all (``--skip-networking``); slurmdbd reaches it through the socket
(``MYSQL_UNIX_PORT``), as the cluster's user, whom MariaDB knows by the socket's peer uid.
``kit cluster up --no-accounting`` leaves it out; without the programs it is left out and said so.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from kit import files
from kit.cluster import network
from kit.errors import KitError

PROGRAMS = ("mariadbd", "mariadb-install-db", "slurmdbd")
INSTALL_HINT = "install Debian's slurmdbd and MariaDB: apt-get install -y slurmdbd mariadb-server"
DATABASE = "kit_acct"


def missing() -> list[str]:
    """The programs accounting needs that are not installed."""
    return [p for p in PROGRAMS if shutil.which(p) is None]


def directory(root: Path) -> Path:
    return root / "accounting"


def db_socket(root: Path) -> Path:
    return directory(root) / "db.sock"


def tmp_dir(root: Path) -> Path:
    """MariaDB's temporary tables: the cluster's own (0700), not /tmp, which every user and every other cluster's
    MariaDB writes (two clusters set up at once on one machine: "Could not remove temporary table
    '/tmp/#sql-temptable-…', error: 2", and mariadb-install-db failed)."""
    return directory(root) / "tmp"


def mariadbd_argv(root: Path, user: str) -> list[str]:
    """MariaDB for the cluster alone: no port, its socket and data in the cluster's directory, small."""
    d = directory(root)
    return [
        "mariadbd",
        "--no-defaults",
        f"--datadir={d / 'data'}",
        f"--socket={db_socket(root)}",
        f"--tmpdir={tmp_dir(root)}",
        "--skip-networking",
        f"--user={user}",
        f"--pid-file={root}/run/mariadbd.pid",
        f"--log-error={root}/log/mariadbd.log",
        "--innodb-buffer-pool-size=32M",
        "--innodb-log-file-size=64M",
        "--innodb-lock-wait-timeout=900",
        "--performance-schema=OFF",
    ]


def storage_lines(st, munge_socket: Path | None) -> list[str]:
    """slurm.conf's accounting lines for ``st`` (``dbd_port`` None: none)."""
    if not getattr(st, "dbd_port", None):
        return ["JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none"]
    lines = [
        "JobAcctGatherType=jobacct_gather/linux",
        "AccountingStorageType=accounting_storage/slurmdbd",
        f"AccountingStorageHost={network.host_address(st)}",
        f"AccountingStoragePort={st.dbd_port}",
    ]
    if munge_socket:  # auth/munge's socket for the connections to slurmdbd (slurm.conf(5))
        lines.append(f"AccountingStoragePass={munge_socket}")
    return lines


def slurmdbd_conf(st, root: Path, user: str, auth: list[str]) -> str:
    """``slurmdbd.conf`` (beside slurm.conf: slurmdbd finds it through ``SLURM_CONF``'s directory)."""
    return (
        "\n".join(
            [
                "# Written by `kit cluster up`: the local cluster's accounting daemon.",
                *auth,
                "DbdHost=localhost",
                f"DbdAddr={network.host_address(st)}",
                f"DbdPort={st.dbd_port}",
                "CommunicationParameters=NoInAddrAny",  # started kit.cluster.config.bound_to its DbdAddr
                f"SlurmUser={user}",
                f"LogFile={root}/log/slurmdbd.log",
                f"PidFile={root}/run/slurmdbd.pid",
                "StorageType=accounting_storage/mysql",
                "StorageHost=localhost",
                f"StorageLoc={DATABASE}",
                f"StorageUser={user}",
            ]
        )
        + "\n"
    )


def write(root: Path, st, user: str, auth: list[str], public: Path | None = None) -> None:
    """The database's directory (made once: its data outlives `down`) and slurmdbd.conf (0600) in ``public``
    (slurm.conf's directory: slurmdbd reads it there; default ``root``)."""
    public = public or root
    d = directory(root)
    d.mkdir(mode=0o700, exist_ok=True)
    os.chmod(d, 0o700)
    tmp_dir(root).mkdir(mode=0o700, exist_ok=True)
    if not (d / "data").is_dir():  # made aside, then renamed: never a half-made database
        aside = d / "data.new"
        files.remove_tree(aside)
        aside.mkdir(mode=0o700)
        proc = subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={aside}",
                f"--user={user}",
                f"--tmpdir={tmp_dir(root)}",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            files.remove_tree(aside)
            raise KitError(
                "mariadb-install-db failed",
                field="cluster",
                exit_code=1,
                detail=(proc.stdout + proc.stderr)[-2000:],
                hint="or `kit cluster up --no-accounting`",
            )
        aside.rename(d / "data")
    conf = public / "slurmdbd.conf"  # beside slurm.conf, its owner's alone
    files.write_atomic(conf, slurmdbd_conf(st, root, user, auth))
    os.chmod(conf, 0o600)  # slurmdbd refuses a config others can read (it may hold a password)


def start_mariadbd(root: Path, user: str, timeout: float) -> int:
    """Start the database; return its pid once its socket answers."""
    with open(root / "log" / "mariadbd.log", "ab") as logf:
        proc = subprocess.Popen(
            mariadbd_argv(root, user), stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True
        )
    wait_for(lambda: _connects(socket.AF_UNIX, str(db_socket(root))), proc, "mariadbd", root, timeout)
    return proc.pid


def wait_for(ready, proc, name: str, root: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            why = (
                "exited while starting"
                if proc is not None and proc.poll() is not None
                else f"did not answer within {timeout:g} s"
            )
            raise KitError(
                f"{name} {why}",
                field="cluster",
                exit_code=1,
                detail=log_tail(root, name),
                hint="or `kit cluster up --no-accounting`",
            )
        time.sleep(0.1)


def dbd_answers(st) -> bool:
    return _connects(socket.AF_INET, (network.host_address(st), st.dbd_port))


def _connects(family: int, address) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        try:
            s.connect(address)
            return True
        except OSError:
            return False


def log_tail(root: Path, name: str) -> str:
    try:
        return "\n".join((root / "log" / f"{name}.log").read_text(errors="replace").splitlines()[-15:])
    except OSError:
        return ""


def drain(target, progress, timeout: float = 15.0) -> None:
    """Wait until slurmctld has handed slurmdbd every record it queued (sdiag's "DBD Agent
    queue size"): a job cancelled by `down` a moment ago is in sacct after `up`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = target.run(["sdiag"], check=False).stdout
        queued = next(
            (
                line.split(":", 1)[1].strip()
                for line in out.splitlines()
                if line.strip().startswith("DBD Agent queue size:")
            ),
            None,
        )
        if queued in (None, "0"):
            return
        time.sleep(0.2)
    progress(f"slurmctld still held {queued} accounting record(s) for slurmdbd after {timeout:g} s")
