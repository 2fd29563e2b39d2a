"""Real OpenSSH servers for the tests (Debian's openssh-server), on loopback ports of their own.

:class:`Servers` starts a login sshd and a jump sshd, key-only, ``LogLevel VERBOSE`` (each accepted
connection is one ``Accepted publickey`` line in its log: the tests count them), and writes a client
configuration as a user's ``~/.ssh/config`` would have it: ``kit-login`` reached through ``kit-jump``
(ProxyJump), ``kit-direct`` straight, ``kit-moved``: the login node with a host key other than the
one known for it, and ``site-a`` and ``site-b``: two sites whose login nodes share one internal name, port and
user (``login.internal``), each reached through its own bastion (a proxy command to the login sshd for A, to the
jump sshd for B), each key known under its own alias. The sshds give their sessions the local cluster's
environment (``SetEnv``), as a site's login node has Slurm's configuration at its default path. Everything lives in one temporary
directory (but sshd's privilege separation directory, /run/sshd, which every sshd of the machine shares and
which is made if missing and left); :meth:`Servers.stop` ends the servers and any master connection the tests
left.

With ``user`` (an ordinary account, `pwd` entry), the login node is theirs as a site's is: the client logs
in as them with a key in their own ``~/.ssh/authorized_keys``, and their sessions get no environment from
the server: what their login side needs is in their own dotfiles.
"""

from __future__ import annotations

import getpass
import os
import pwd
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> str:
    """A new ed25519 key at ``path``; its public line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kit-test", "-f", str(path)], check=True)
    return Path(f"{path}.pub").read_text().strip()


class Servers:
    def __init__(self, root: Path, login_env: dict[str, str], user=None):
        self.root = root
        self.user = user
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports = {"login": free_port(), "jump": free_port()}
        self.dot_ssh = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh"  # kit makes it for its master's socket
        self.made_dot_ssh = not self.dot_ssh.exists()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        self.client_key = root / "id_ed25519"
        public = keygen(self.client_key)
        (root / "authorized_keys").write_text(public + "\n")
        if user is not None:
            self._authorize(user, public)
        for name in ("login", "jump", "other"):
            keygen(root / f"host_{name}")
        self.config = root / "ssh_config"
        self.login_env = login_env
        self._write_client_config()

    @staticmethod
    def _authorize(user, public: str) -> None:
        """``public`` in ``user``'s own ~/.ssh/authorized_keys (theirs, 0600), their account unlocked for a key
        login (useradd leaves it locked: "!", which sshd without PAM refuses)."""
        subprocess.run(["usermod", "-p", "*", user.pw_name], check=True, capture_output=True)
        dot_ssh = Path(user.pw_dir) / ".ssh"
        dot_ssh.mkdir(mode=0o700, exist_ok=True)
        keys = dot_ssh / "authorized_keys"
        keys.write_text(public + "\n")
        for path, mode in ((dot_ssh, 0o700), (keys, 0o600)):
            os.chown(path, user.pw_uid, user.pw_gid)
            os.chmod(path, mode)

    def _write_client_config(self) -> None:
        known = self.root / "known_hosts"
        moved = self.root / "known_hosts.moved"
        key = lambda name: " ".join((self.root / f"host_{name}.pub").read_text().split()[:2])  # noqa: E731
        known.write_text(
            f"[127.0.0.1]:{self.ports['login']} {key('login')}\n[127.0.0.1]:{self.ports['jump']} {key('jump')}\n"
        )
        moved.write_text(f"[127.0.0.1]:{self.ports['login']} {key('other')}\n")
        common = (
            f"  HostName 127.0.0.1\n  IdentityFile {self.client_key}\n"
            f"  IdentitiesOnly yes\n  StrictHostKeyChecking yes\n  UpdateHostKeys no\n"
        )
        me = f"  User {getpass.getuser()}\n"
        login = f"  User {self.user.pw_name}\n" if self.user is not None else me
        sites = self.root / "known_hosts.sites"
        sites.write_text(f"site-a {key('login')}\nsite-b {key('jump')}\n")

        def site(name, port):
            return (
                f"Host {name}\n  HostName login.internal\n  Port 22\n  HostKeyAlias {name}\n"
                f"  ProxyCommand socat - TCP:127.0.0.1:{port}\n{login}  IdentityFile {self.client_key}\n"
                f"  IdentitiesOnly yes\n  StrictHostKeyChecking yes\n  UpdateHostKeys no\n"
                f"  UserKnownHostsFile {sites}\n"
            )

        self.config.write_text(
            site("site-a", self.ports["login"])
            + site("site-b", self.ports["jump"])
            + f"Host kit-login\n  Port {self.ports['login']}\n  ProxyJump kit-jump\n{login}{common}  UserKnownHostsFile {known}\n"
            f"Host kit-direct\n  Port {self.ports['login']}\n{login}{common}  UserKnownHostsFile {known}\n"
            f"Host kit-jump\n  Port {self.ports['jump']}\n{me}{common}  UserKnownHostsFile {known}\n"
            f"Host kit-moved\n  Port {self.ports['login']}\n{login}{common}  UserKnownHostsFile {moved}\n"
        )

    def start(self) -> "Servers":
        for name, port in self.ports.items():
            cfg = self.root / f"sshd_{name}.conf"
            setenv = (
                "SetEnv " + " ".join(f'{k}="{v}"' for k, v in self.login_env.items()) + "\n" if self.login_env else ""
            )  # the jump sshd serves site-b's sessions too
            cfg.write_text(
                f"Port {port}\nListenAddress 127.0.0.1\nHostKey {self.root / f'host_{name}'}\n"
                f"AuthorizedKeysFile {self._keys_file(name)}\nPubkeyAuthentication yes\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
                "UsePAM no\nStrictModes no\nLogLevel VERBOSE\nAllowTcpForwarding yes\nMaxStartups 50\n"
                f"PidFile {self.root / f'sshd_{name}.pid'}\n{setenv}"
            )
            log = open(self.root / f"sshd_{name}.log", "wb")
            self.procs[name] = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT
            )
        for name, port in self.ports.items():
            deadline = time.monotonic() + 15
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or self.procs[name].poll() is not None:
                        raise RuntimeError(f"sshd {name} did not start: {self.log(name)}") from None
                    time.sleep(0.05)
        return self

    def _keys_file(self, name: str) -> str:
        """The login node's: the user's own (relative to their home), when it is theirs; the jump sshd takes
        them too (it is site-b's login node)."""
        if self.user is None:
            return str(self.root / "authorized_keys")
        return ".ssh/authorized_keys" if name == "login" else f"{self.root / 'authorized_keys'} .ssh/authorized_keys"

    def log(self, name: str) -> str:
        path = self.root / f"sshd_{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def accepted(self, name: str) -> int:
        """Connections the server accepted so far (one ``Accepted publickey`` line each)."""
        return self.log(name).count("Accepted publickey")

    def ssh(self) -> list[str]:
        return ["ssh", "-F", str(self.config)]

    def control_path(self, host: str) -> list[str]:
        """The ssh options that name kit's master socket to ``host``."""
        from kit.remote import ssh

        return ["-o", "ControlPath=" + ssh.control_path(ssh.Host.of(host, {"KIT_SSH": " ".join(self.ssh())}))]

    def master_pid(self, host: str) -> int | None:
        check = subprocess.run(
            [*self.ssh(), *self.control_path(host), "-O", "check", host], capture_output=True, text=True, timeout=10
        )
        found = re.search(r"pid=(\d+)", check.stderr)
        return int(found.group(1)) if check.returncode == 0 and found else None

    def close_masters(self) -> None:
        for host in ("kit-login", "kit-direct", "kit-moved", "site-a", "site-b"):
            for path in (self.control_path(host), []):
                subprocess.run([*self.ssh(), *path, "-O", "exit", host], capture_output=True, timeout=10)

    def stop(self) -> None:
        self.close_masters()
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # /run/sshd stays: every sshd on the machine needs it for each new connection (another suite's, or a
        # bench's, beside this one: removing it closed their connections at key exchange). ~/.ssh goes only when
        # empty (another run's master sockets keep it).
        if self.made_dot_ssh:
            try:
                self.dot_ssh.rmdir()
            except OSError:
                pass
