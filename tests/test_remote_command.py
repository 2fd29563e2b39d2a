"""What kit asks the login node's shell to run (kit.remote.remote_command), without an sshd: the command's
arguments arrive byte for byte whatever the login shell (bash, dash here; csh parses the same single-quoted
`sh -c` word), and a kit that is not there is exit 127 with nothing said."""

from __future__ import annotations

import subprocess

import pytest

from kit import remote
from kit.version import __version__

TRICKY = ["ps", "a b", "it's", '"quoted"', "$HOME", "`id`", "semi;colon", "back\\slash", "*", "", "--", "ünï"]


@pytest.mark.parametrize("shell", ["bash", "dash"])
def test_arguments_reach_kit_there_byte_for_byte_and_it_is_told_the_clients_version(shell):
    host = remote.Host("login", remote_kit=("sh", "-c", 'printf "%s\\n" "$KIT_CLIENT_VERSION" "$@"', "kit"))
    out = subprocess.run([shell, "-c", remote.remote_command(host, TRICKY)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:-1] == [__version__, *TRICKY]


@pytest.mark.parametrize("shell", ["bash", "dash"])
def test_no_kit_there_is_127_and_silence(shell):
    host = remote.Host("login", remote_kit=("/nonexistent/kit",))
    out = subprocess.run([shell, "-c", remote.remote_command(host, ["ps"])], capture_output=True, text=True)
    assert (out.returncode, out.stdout, out.stderr) == (127, "", "")
