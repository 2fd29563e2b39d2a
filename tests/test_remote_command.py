"""What kit asks the login node's shell to run (kit.client.start), without an sshd: a stand-in for ssh runs the
command it is given with a login shell of each family (bash, dash, tcsh: csh parses the same single-quoted `sh -c`
word; what it would not pass on travels as base64). The command's arguments never appear on the login node's command
line — they are the channel's first line, which kit there reads (`kit remote-args`) — and arrive byte for byte; a
kit that is not there is exit 127 with nothing said."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kit.remote import client, ssh, wire
from kit.version import __version__

TRICKY = [
    "ps",
    "a b",
    "it's",
    '"quoted"',
    "$HOME",
    "`id`",
    "semi;colon",
    "back\\slash",
    "*",
    "",
    "--",
    "ünï",
    "~",
    "{a,b}",
    "%1",
    "a=b",
    "bang!",
    "!!",
    "!$",
    "new\nline",
    "it's!",
    "--env=TOKEN=s3cret",
]
SHELLS = ["bash", "dash", "tcsh"]  # tcsh: the csh of Debian (.ci/setup installs it)
# kit there: says the client's version, the command line it was given, and the arguments it read
THERE = (
    "import os, sys; from kit.remote import wire; wire.hello(); "
    "sys.stdout.write('\\0'.join([os.environ['KIT_CLIENT_VERSION'], *sys.argv[1:], '|', *wire.read_args()]))"
)


def _host(tmp_path, shell: str, remote_kit: tuple[str, ...]) -> ssh.Host:
    """A host whose "ssh" runs the remote command with ``shell`` here, recording that command."""
    fake = tmp_path / "ssh"
    fake.write_text(
        "import os, sys\n"
        f"open({str(tmp_path / 'command')!r}, 'w').write(sys.argv[-1])\n"
        "os.execvp(sys.argv[1], [sys.argv[1], '-c', sys.argv[-1]])\n"
    )
    return ssh.Host("login", ssh=(sys.executable, str(fake), shell), remote_kit=remote_kit)


def finished(proc: subprocess.Popen, timeout: float = 60) -> tuple[bytes, bytes]:
    """What client.start's process printed after kit's hello, and its stderr, once it ended: its stdout read
    through the buffer start() read the hello with (communicate() reads the pipe itself, past that buffer)."""
    err = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()))
    reader.start()
    out = proc.stdout.read()
    proc.wait(timeout)
    reader.join(timeout)
    return out, err[0]


@pytest.mark.parametrize("kit_there", ["plain", "base64"])
@pytest.mark.parametrize("shell", SHELLS)
def test_arguments_reach_kit_there_byte_for_byte_off_its_command_line(tmp_path, shell, kit_there):
    # A KIT_REMOTE_KIT with a "!" in it (csh would expand it): the command travels as base64.
    prefix = ("env", "KIT_NOTE=hi!") if kit_there == "base64" else ()
    host = _host(tmp_path, shell, (*prefix, sys.executable, "-c", THERE))
    proc = client.start(host, TRICKY, [])
    out, err = finished(proc)
    assert proc.returncode == 0, err
    command = (tmp_path / "command").read_text()
    assert ("base64 -d" in command) == (kit_there == "base64")  # the plain form stays readable where it can
    assert out.decode().split("\0") == [__version__, wire.ARGS_COMMAND, "|", *TRICKY]
    assert "s3cret" not in command and "TOKEN" not in command  # not on the login node's `ps`


@pytest.mark.parametrize("shell", SHELLS)
def test_no_kit_there_is_127_and_silence(tmp_path, shell):
    proc = client.start(_host(tmp_path, shell, ("/nonexistent/kit",)), ["logs", "bang!"], [])
    out, err = finished(proc)
    assert (proc.returncode, out, err) == (127, b"", b"")


def test_kit_there_refuses_input_that_is_no_command():
    for given in (b"", b"not json\n", b'{"argv": 1}\n', b'["ps", 3]\n', b'["a\\u0000b"]\n'):
        proc = subprocess.run(
            [sys.executable, "-m", "kit", wire.ARGS_COMMAND],
            input=given,
            capture_output=True,
            env={"PATH": "/usr/bin:/bin", wire.VERSION_VARIABLE: __version__},
        )
        assert (proc.returncode, proc.stderr) == (2, b"kit: remote-args: the client sent no command\n"), given


@pytest.mark.parametrize(
    "argv",
    [["--host", "", "ps"], ["--host=", "ps"], ["--host", " ", "launch", "--", "true"], ["--host", "", "build", "x"]],
)
def test_an_empty_host_is_refused_never_run_here(tmp_path, argv):
    """`--host ''` (a variable that was empty: `kit --host "$LOGIN" ps`) ran the command on the laptop, against
    whatever Slurm the laptop has. One line, exit 2, nothing run (no job directory written)."""
    proc = subprocess.run(
        [sys.executable, "-m", "kit", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 2 and proc.stderr.startswith("kit: --host: "), proc.stderr
    assert "Traceback" not in proc.stderr and list(tmp_path.iterdir()) == [], proc.stderr


def test_a_hosted_report_is_written_over_planted_links_not_through_them(tmp_path, monkeypatch):
    """`kit --host … report -o FILE` (kit.job.sides.summarize_here): the picture and its .json are new files renamed over
    the names, as the local report writes them. Links another local user planted at both names (a shared
    directory) were followed: the laptop user's report overwrote the files they point at."""
    import kit

    victims = [tmp_path / "victim.png", tmp_path / "victim.json"]
    for v in victims:
        v.write_text("theirs\n")
    out = tmp_path / "shared" / "report.png"
    out.parent.mkdir()
    out.symlink_to(victims[0])
    out.with_suffix(".json").symlink_to(victims[1])
    job = kit.Job("/there/job", host="login")
    answer = {"lines": [], "warnings": [], "numbers": {"samples_per_s": 1}, "picture_bytes": "UE5H"}
    monkeypatch.setattr(job.there, "call", lambda *a, **k: answer)
    got = job.summarize(output=out)
    assert [v.read_text() for v in victims] == ["theirs\n", "theirs\n"]
    assert not out.is_symlink() and out.read_bytes() == b"PNG" and got.picture == str(out)
    assert json.loads(out.with_suffix(".json").read_text()) == {"samples_per_s": 1}


class _Stream(io.BytesIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_the_login_nodes_escape_sequences_reach_a_terminal_as_text():
    """What `kit --host` relays (client.run's output and stderr, a launch's lines): a hostile login node's escape
    sequences (OSC 52 sets the laptop's clipboard; CSI clears the screen; a C1 CSI split between two reads) are
    written as text to a terminal, never acted on; tabs, line ends, a progress bar's carriage returns and UTF-8
    text as they came. To a file or a pipe, the bytes as they came (`kit --host … logs > file`)."""
    from kit.core.text import Shown

    chunks = [b"step 1\tloss 0.5\r\n\x1b]52;c;aGk=\x07 caf\xc3\xa9 \xc2", b"\x9b2J\x00done\n"]
    tty, pipe = _Stream(True), _Stream(False)
    for stream in (tty, pipe):
        shown = Shown(stream)
        for chunk in chunks:
            shown(chunk)
    assert tty.getvalue() == b"step 1\tloss 0.5\r\n\\x1b]52;c;aGk=\\x07 caf\xc3\xa9 \\xc2\\x9b2J\\x00done\n"
    assert pipe.getvalue() == b"".join(chunks)


def test_a_damaged_object_on_the_login_node_is_asked_for_again(tmp_path, monkeypatch):
    """The laptop's side of a launch (transfer._send) against the login node's (receive, in a process of its
    own with its KIT_HOME): a snapshot's objects go once; an object there whose content no longer matches its
    name was taken as present, and every launch of that content ran the damaged file. Now it is asked for again,
    and the job's tree has the whole file."""
    from kit.code import snapshot as snapshots
    from kit.code import store as codestore
    from kit.remote import transfer

    repo, laptop, login = tmp_path / "repo", tmp_path / "laptop", tmp_path / "login"
    repo.mkdir()
    (repo / "train.py").write_text("print('whole')\n")
    (repo / "util.py").write_text("X = 1\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.email=t@kit", "-c", "user.name=t", "commit", "-qm", "1"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    monkeypatch.setenv("KIT_HOME", str(laptop))
    snap = snapshots.take(repo, store=snapshots.store_for(laptop))

    def launch() -> int:
        there = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from kit.remote.transfer import receive; import sys; print(receive('t', '.')[1], file=sys.stderr)",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "KIT_HOME": str(login)},
        )
        with codestore.opened(Path(snap.store), create=False) as (_, objects, manifests):
            count, _, _ = transfer._send(there, *transfer.outgoing(snap, objects, manifests))
        _, err = there.communicate(timeout=60)
        assert there.returncode == 0, err
        launch.tree = Path(err.decode().strip())
        return count

    assert launch() == 2 and launch() == 0
    [damaged] = [p for p in (login / "code" / "objects").iterdir() if p.read_bytes() == b"print('whole')\n"]
    damaged.chmod(0o644)
    damaged.write_text("print('damaged')\n")
    assert launch() == 1
    assert (launch.tree / "train.py").read_text() == "print('whole')\n" == damaged.read_text()
    assert launch() == 0


def test_kit_theres_answers_are_records_a_banner_cannot_be_taken_for(monkeypatch):
    """kit.remote.wire: what a login shell prints before kit's hello is skipped (a banner, a motd), never parsed, and
    bounded (a hostile login node's endless noise, or a 1 GiB line, is refused, not held); text between records
    reaches the person as it came, the records (even one split across reads) do not."""
    from kit.remote import wire

    banner = b'Welcome to login1! Quota: 93% of /home used\n{"job_dir": "/not/kits"}\n'
    stream = io.BytesIO(banner + wire.record({"kit": "x"}) + wire.record({"missing": ["a"]}))
    assert wire.read(stream) == {"kit": "x"} and wire.read(stream) == {"missing": ["a"]}
    with pytest.raises(wire.NoRecord, match="ended"):
        wire.read(stream)
    monkeypatch.setattr(wire, "NOISE_LIMIT", 1000)
    with pytest.raises(wire.NoRecord, match="before kit's answer"):
        wire.read(io.BytesIO(b"x" * 999 + b"\n" + b"y\n" + wire.record({"kit": "x"})))
    monkeypatch.setattr(wire, "RECORD_LIMIT", 100)
    with pytest.raises(wire.NoRecord, match="longer than"):
        wire.read(io.BytesIO(wire.MARK + b"{" + b" " * 200 + b"}\n"))
    shown = []
    records = wire.Records(shown.append)
    whole = b"Submitted job 7\n" + wire.record({"launched": {"job_id": "7"}}) + b"job dir: /d\nwaiting"
    for i in range(0, len(whole), 5):  # in pieces, a record split across them
        records(whole[i : i + 5])
    assert b"".join(shown) == b"Submitted job 7\njob dir: /d\nwaiting"
    assert records.seen == [{"launched": {"job_id": "7"}}]


def test_a_login_nodes_endless_line_is_refused_at_the_noise_limit():
    """200 MB without a newline before kit's hello took the laptop 86 s and 20 s of CPU (a byte a read, the limit
    checked at each line's end): it is refused once the limit is read, the line's rest never read."""
    from kit.remote import wire

    class Endless(io.RawIOBase):
        left = 200 << 20

        def readable(self):
            return True

        def readinto(self, buffer):
            n = min(len(buffer), self.left)
            buffer[:n] = b"x" * n
            self.left -= n
            return n

    raw = Endless()
    with pytest.raises(wire.NoRecord, match="before kit's answer"):
        wire.read(io.BufferedReader(raw))
    consumed = (200 << 20) - raw.left
    assert wire.NOISE_LIMIT < consumed <= wire.NOISE_LIMIT + io.DEFAULT_BUFFER_SIZE * 2, consumed
