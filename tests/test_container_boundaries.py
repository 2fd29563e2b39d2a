"""The container runtime as a hostile user of the machine's cluster meets it: Slurm's own `srun`, no kit CLI.

pyxis and enroot do nothing as root whose path or bytes a job's user chose: enroot unpacks and mounts as the user,
and resolves names and mount destinations inside the container. kit's stand-in runs parts of this as root in
slurmstepd; each test here plays the user who tries to make that root act outside the container, and holds on the
stand-in and on real pyxis + enroot (``KIT_TEST_CLUSTER``)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from helpers import as_user, container_mode, named_containers
from images import tiny_rootfs

pytestmark = pytest.mark.cluster


def users_image(user, root: Path, name: str, *pseudo: str, raw: bool = False) -> Path:
    """ROOT packed into the user's home as NAME, theirs, with mksquashfs pseudo-definitions (no privilege needed:
    any user can put a set-id root file or a device node in an image). RAW: nothing compressed (bytes to patch)."""
    image = Path(user.pw_dir) / name
    options = ["-noI", "-noD", "-noF", "-noX"] if raw else []
    definitions = [arg for p in pseudo for arg in ("-p", p)]
    subprocess.run(
        ["mksquashfs", str(root), str(image), "-noappend", "-quiet", "-no-progress", *options, *definitions],
        check=True,
    )
    os.chown(image, user.pw_uid, user.pw_gid)
    return image


def patched(image: Path, old: bytes, new: bytes) -> None:
    """IMAGE's one occurrence of OLD rewritten in place as NEW (same length), as its owner may at any moment."""
    data = image.read_bytes()
    assert data.count(old) == 1 and len(old) == len(new)
    with open(image, "r+b") as f:
        f.seek(data.index(old))
        f.write(new)


@pytest.fixture
def outside():
    """A directory of root's (0755) outside every container, which no test's step may touch: a marker in it."""
    d = Path(tempfile.mkdtemp(prefix="kit-test-outside-", dir="/var/tmp"))
    os.chmod(d, 0o755)
    (d / "marker").write_text("root's\n")
    yield d
    shutil.rmtree(d)


def srun(cluster, user, args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return as_user(user, f"srun -N1 -w node1 {args}", env=f"; export SLURM_CONF={cluster.conf}", timeout=timeout)


def test_a_container_name_names_a_container_never_a_path(cluster, user, tmp_path, outside):
    """The stand-in made a named container's directory from the name as text and unpacked the image there as root:
    `NAME/../../…/DIR` put a set-id root file of the user's image at DIR on the host (another user then ran it as
    euid 0), let them `rm -rf` as root any path ending in `.new`, and bound any host directory as a container's root
    (root then made mount points and rewrote passwd in it). A name is refused unless it is a name (pyxis's letters,
    digits, '.', '_', '-'; enroot: "Invalid argument"), and a named container is unpacked as its user: nothing in
    it is root's or set-id root on the host."""
    image = users_image(user, tiny_rootfs(tmp_path / "root"), "setid.sqsh", "suidid f 4755 0 0 echo set-id")
    name = f"kit-test-{os.getpid()}"
    containers = named_containers(cluster, "node1", user.pw_uid)
    climb = f"{name}/" + "../" * 40
    try:
        with container_mode(cluster, "create"):
            made = srun(cluster, user, f"--container-image={image} --container-name={name} /bin/cat /suidid")
            assert (made.returncode, made.stdout) == (0, "set-id\n"), made.stdout + made.stderr
            unpacked = os.lstat(containers / f"pyxis_{name}" / "suidid")
            assert unpacked.st_uid == user.pw_uid, unpacked  # unpacked as them: no file of root's
            assert not (unpacked.st_uid == 0 and unpacked.st_mode & (stat.S_ISUID | stat.S_ISGID)), unpacked

            landed = outside / "landed"
            escape = srun(cluster, user, f"--container-image={image} --container-name={climb}{landed} /bin/true")
            assert escape.returncode != 0, escape.stdout + escape.stderr
            bound = srun(cluster, user, f"--container-name={climb}{outside} /bin/true")  # no image: an existing dir
            assert bound.returncode != 0, bound.stdout + bound.stderr
            assert sorted(os.listdir(outside)) == ["marker"], os.listdir(outside)
            assert "Invalid argument" in escape.stderr, escape.stderr  # enroot's words (real pyxis: no such name)
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(containers / f"pyxis_{name}")], check=True)


def test_an_image_its_listing_cannot_read_is_refused_never_mounted(cluster, user, tmp_path):
    """A device node in a user's image (a pseudo-definition: `evildev c 666 0 0 1 3`) behind a name the listing
    refuses ('/' in it): the stand-in took a failed listing for "no device node" and the kernel mounted the image
    without nodev, so the user opened the device. Refused: an image that cannot be listed is no image (enroot's
    unsquashfs fails on it too), and every mount of a user's image is nodev and nosuid."""
    root = tiny_rootfs(tmp_path / "root")
    (root / "etc" / "aaaaXbbbb").write_text("x\n")
    image = users_image(user, root, "corrupt.sqsh", "evildev c 666 0 0 1 3", raw=True)
    patched(image, b"aaaaXbbbb", b"aaaa/bbbb")
    probe = "'test -c /evildev && echo device; cat /evildev && echo opened'"
    with container_mode(cluster, "create"):
        run = srun(cluster, user, f"--container-image={image} --container-workdir=/ /bin/sh -c {probe}")
    assert run.returncode != 0 and "device" not in run.stdout and "opened" not in run.stdout, run.stdout + run.stderr


def test_the_image_checked_is_the_image_mounted(cluster, user, tmp_path):
    """The user may rewrite their image at any moment: the stand-in listed it, then the kernel read the same file
    lazily, so bytes changed after the check (an inode turned into a block device: root's loop0 read and written)
    were what the container saw. Root mounts a copy only it can change, made before the check: a file rewritten
    while the step runs is not what its container reads."""
    root = tiny_rootfs(tmp_path / "root")
    shutil.copy2(shutil.which("sleep"), root / "bin" / "sleep")  # libc's alone, as cat's
    # The bytes read at the end lie far from any the step's start reads (the kernel reads ahead, and keeps).
    (root / "f").write_text("x" * 2**21 + "kit-original" + "y" * 2**21)
    image = users_image(user, root, "rewritten.sqsh", raw=True)
    sync = Path(user.pw_dir) / "sync"
    sync.mkdir()
    os.chown(sync, user.pw_uid, user.pw_gid)
    wait = "'echo up >/sync/up; while [ ! -e /sync/go ]; do sleep 0.1; done; cat /f'"
    command = f"--container-image={image} --container-mounts={sync}:/sync --container-workdir=/ /bin/sh -c {wait}"
    try:
        with container_mode(cluster, "create"):
            step = subprocess.Popen(
                ["su", "-", user.pw_name, "-s", "/bin/bash", "-c", f"SLURM_CONF={cluster.conf} srun -N1 {command}"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            deadline = time.monotonic() + 120
            while not (sync / "up").exists() and step.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            patched(image, b"kit-original", b"kit-replaced")  # after its container was made, before it reads /f
            (sync / "go").touch()
            out, err = step.communicate(timeout=120)
        assert step.returncode == 0 and "kit-replaced" not in out and "kit-original" in out, err
    finally:
        shutil.rmtree(sync)


def test_a_mount_destination_stays_inside_the_container(cluster, user, tmp_path, outside):
    """--container-mounts destinations were joined to the container's root as text, their mount points made by
    root: `SRC:/../../…/DIR/f` (and a symlink in the image pointing out) made root-owned files and directories
    anywhere on the host. A destination is resolved inside the container's root; one climbing out with ".." is
    refused; a symlink in the image is followed only inside it."""
    root = tiny_rootfs(tmp_path / "root")
    (root / "out").symlink_to(outside)
    image = users_image(user, root, "symlinked.sqsh")
    payload = Path(user.pw_dir) / "payload"
    payload.write_text("theirs\n")
    os.chown(payload, user.pw_uid, user.pw_gid)
    with container_mode(cluster, "create"):
        for dst in ("/" + "../" * 40 + f"{outside}/climbed/f", "/out/linked/f"):
            run = srun(cluster, user, f"--container-image={image} --container-mounts={payload}:{dst} /bin/true")
            assert sorted(os.listdir(outside)) == ["marker"], (dst, os.listdir(outside), run.stderr)
