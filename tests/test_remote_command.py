"""What kit asks the login node's shell to run (kit.remote.remote_command), without an sshd: the command's
arguments arrive byte for byte whatever the login shell (bash, dash, tcsh: csh parses the same single-quoted
`sh -c` word; what it would not pass on travels as base64), and a kit that is not there is exit 127 with nothing
said."""

from __future__ import annotations

import subprocess

import pytest

from kit import remote
from kit.version import __version__

TRICKY = ["ps", "a b", "it's", '"quoted"', "$HOME", "`id`", "semi;colon", "back\\slash", "*", "", "--", "ünï",
          "~", "{a,b}", "%1", "a=b"]
CSH_TRICKY = ["bang!", "!!", "!$", "new\nline", "it's!"]  # what csh would not pass on in a single-quoted word
SHELLS = ["bash", "dash", "tcsh"]  # tcsh: the csh of Debian (.ci/setup installs it)


@pytest.mark.parametrize("tricky", [TRICKY, TRICKY + CSH_TRICKY], ids=["plain", "base64"])
@pytest.mark.parametrize("shell", SHELLS)
def test_arguments_reach_kit_there_byte_for_byte_and_it_is_told_the_clients_version(shell, tricky):
    host = remote.Host("login", remote_kit=("sh", "-c", 'printf "%s\\0" "$KIT_CLIENT_VERSION" "$@"', "kit"))
    command = remote.remote_command(host, tricky)
    assert ("base64 -d" in command) == (tricky is not TRICKY)  # the plain form stays readable where it can
    out = subprocess.run([shell, "-c", command], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\0")[:-1] == [__version__, *tricky]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("argv", [["ps"], ["logs", "bang!"]])
def test_no_kit_there_is_127_and_silence(shell, argv):
    host = remote.Host("login", remote_kit=("/nonexistent/kit",))
    out = subprocess.run([shell, "-c", remote.remote_command(host, argv)], capture_output=True, text=True)
    assert (out.returncode, out.stdout, out.stderr) == (127, "", "")
