"""Shared fixtures: one real local Slurm cluster per test session.

The cluster lives under a temporary KIT_HOME, so tests never touch a
cluster the developer runs. A test that needs a missing tool fails with the
command that installs it; nothing is skipped. Helpers live in helpers.py.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers import NO_DEVICES, REPO, Person, as_user, remove_user, require

from kit import slurm
from kit.cluster import LocalCluster
from kit.errors import KitError


def pytest_collection_modifyitems(config, items) -> None:
    """Every test that uses a local cluster (the session's, or test_recovery's own 3-node one)
    is marked ``cluster``: -m 'not cluster' runs the rest. A test marked ``machine_wide`` changes what every
    process on the machine reads (/etc/hosts: an srun of another worker's cluster, started meanwhile, never heard
    back from its controller, nor slurmstepd from srun), or reads what only holds on a machine where its session's
    cluster is the newest (an ordinary user's kit, with no SLURM_CONF, finds root's newest cluster itself: beside
    another worker's it found that one, which its test then took down): pytest-xdist's workers leave it out, and the
    README's command runs it alone after them (-m machine_wide)."""
    for item in items:
        if {"cluster", "three"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        alone = [item for item in items if item.get_closest_marker("machine_wide")]
        if alone:
            config.hook.pytest_deselected(items=alone)
            items[:] = [item for item in items if not item.get_closest_marker("machine_wide")]


@pytest.fixture(scope="session")
def debian_base() -> Path:
    """containers/bases/debian-bookworm, made with debootstrap when missing (~45 s)."""
    require("debootstrap")
    base = REPO / "containers" / "bases" / "debian-bookworm"
    subprocess.run(
        ["bash", str(REPO / "containers" / "bases" / "debian-bookworm.sh"), str(base)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    return base


@pytest.fixture(scope="session")
def image_cache() -> Path:
    """The KIT_HOME whose build cache keeps cpu_image between this checkout's test sessions (the README's second
    pytest command finds it built by the first): named by what goes into it besides the base, which kit's own
    cache key covers — the recipe and kit's image code —, so a change to either builds anew; others removed."""
    import hashlib

    parts = [REPO / "containers" / "cpu-lightning.toml", *sorted((REPO / "kit" / "image").glob("*.py"))]
    name = f"kit-home-{hashlib.sha256(b''.join(p.read_bytes() for p in parts)).hexdigest()[:16]}"
    caches = REPO / ".test-cache"
    for old in caches.glob("kit-home-*"):
        if old.name != name:
            subprocess.run(["rm", "-rf", "--one-file-system", str(old)], check=False)
    (caches / name).mkdir(parents=True, exist_ok=True, mode=0o700)
    return caches / name


@pytest.fixture(scope="session")
def cpu_image(debian_base, image_cache, tmp_path_factory) -> Path:
    """containers/cpu-lightning.toml built once per run: kit's own image (no `ip` in it). The workers of one run
    share it (the first builds it, the others wait for it: ~100 s of 2 cores each saved); no test writes to it."""
    import fcntl

    from helpers import kit

    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    out = shared / "cpu-lightning.sqsh"
    with open(shared / "cpu-lightning.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():  # kit build writes it whole or not at all
            proc = kit(
                "build",
                str(REPO / "containers" / "cpu-lightning.toml"),
                "-o",
                str(out),
                "--base",
                f"rootfs={debian_base}",
                env={"KIT_HOME": str(image_cache)},
                timeout=1200,
            )
            assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="session", autouse=True)
def kit_home(tmp_path_factory) -> Path:
    """A KIT_HOME of the session's own; the caller's is restored after the session."""
    home = tmp_path_factory.mktemp("kit-home")
    before = os.environ.get("KIT_HOME")
    os.environ["KIT_HOME"] = str(home)
    yield home
    if before is None:
        os.environ.pop("KIT_HOME", None)
    else:
        os.environ["KIT_HOME"] = before
    forget_checkpoints(tmp_path_factory.getbasetemp())


def forget_checkpoints(basetemp: Path) -> None:
    """The node tiers of kit's checkpoints (``/dev/shm``; ``$TMPDIR``, which Slurm sets to ``/tmp``:
    kit-ckpt-<uid>/<key>/) of every job this session made, any user's: a cancelled or failed job's are left on its
    nodes (kit's keepers collect them only later), and no test leaves anything behind. A key is the session's when
    its ``job`` file names a job directory below the session's base, or one gone (a bench's temporary directory, a
    test user's home, removed before this runs)."""
    from kit.train import snapshots

    mine = str(basetemp.resolve()) + "/"
    for base in {Path("/dev/shm"), Path(os.environ.get("TMPDIR") or "/var/tmp"), Path("/var/tmp"), Path("/tmp")}:
        for key in base.glob("kit-ckpt-*/*"):
            try:
                of = (key / snapshots.JOB).read_text()
            except OSError:
                continue
            if of.startswith(mine) or not Path(of).is_dir():
                shutil.rmtree(key, ignore_errors=True)
        for root in base.glob("kit-ckpt-*"):
            with contextlib.suppress(OSError):
                root.rmdir()  # when empty (another session's jobs may be in it)


@pytest.fixture(scope="session")
def cluster(kit_home) -> LocalCluster:
    """A 2-node cluster (4 CPUs, 2 count-only GPUs per node) with Prometheus, for the whole session.

    ``KIT_TEST_CLUSTER=KIT_HOME`` runs the tests on the local cluster already up
    under that KIT_HOME instead, neither started nor stopped: on a machine with
    real pyxis and enroot, `kit cluster up --nodes 2 --cpus-per-node 4
    --gpus-per-node 2 --prometheus` hosts them, and the container tests run
    there untouched (containers/README.md, conformance table)."""
    require("slurmctld")
    external = os.environ.get("KIT_TEST_CLUSTER")
    if external:
        os.environ["KIT_HOME"] = external
        c = LocalCluster(Path(external))
        if not c.running():
            pytest.fail(
                f"KIT_TEST_CLUSTER={external}: no local cluster is running there (kit cluster up)", pytrace=False
            )
        yield c
        return
    c = LocalCluster(kit_home)
    require("prometheus")
    try:
        c.up(nodes=2, cpus_per_node=4, gpus_per_node=2, prometheus=True)
    except KitError as e:  # what the failed command said, not the message alone
        pytest.fail(e.format(), pytrace=False)
    yield c
    c.down(force=True)


@pytest.fixture
def target(cluster) -> slurm.Target:
    return cluster.target


@pytest.fixture
def full_disk(tmp_path):
    """A small tmpfs, filled up (``targets/``, made before, is an empty directory on it)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    try:
        (mnt / "targets").mkdir()
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


@pytest.fixture(scope="session")
def user():
    """An ordinary user with a home (Debian's dotfiles: ~/.bashrc returns early when not interactive) and kit
    in ~/venv, installed from a wheel of this checkout with its report extra (matplotlib)."""
    name = f"kitl{os.getpid() % 100000}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True, capture_output=True)
    wheels = Path(tempfile.mkdtemp(prefix="kit-wheel-"))
    try:
        # What the wheel is built from, and nothing else: the checkout also holds what tests make as they run
        # (.test-cache, where another worker may be writing an image's layers; a copy of the whole tree raced it).
        src = wheels / "src"
        src.mkdir()
        for part in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO / part, src / part)
        for part in ("kit", "launch", "monitoring"):
            shutil.copytree(REPO / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run(
            [
                os.environ.get("KIT_TEST_PYTHON", "/usr/bin/python3"),
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                str(src),
                "-w",
                str(wheels),
            ],
            check=True,
            capture_output=True,
        )
        os.chmod(wheels, 0o755)
        for w in wheels.glob("*.whl"):
            os.chmod(w, 0o644)
        entry = pwd.getpwnam(name)
        [wheel] = wheels.glob("*.whl")  # with the report extra: `kit report` there draws its picture
        proc = as_user(
            entry,
            f"/usr/bin/python3 -m venv ~/venv && ~/venv/bin/pip install -q "
            f"--disable-pip-version-check '{wheel}[report]'",
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        yield entry
    finally:
        shutil.rmtree(wheels, ignore_errors=True)
        remove_user(name)


@pytest.fixture(scope="session")
def user_image(user, cpu_image) -> Path:
    """kit's image, the ordinary user's copy (in their home, theirs)."""
    image = Path(user.pw_dir) / "cpu-lightning.sqsh"
    shutil.copyfile(cpu_image, image)
    os.chown(image, user.pw_uid, user.pw_gid)
    return image


@pytest.fixture(scope="session")
def base_image(debian_base, user) -> Path:
    """The Debian base as an image with no /etc/rc and no PATH in /etc/environment (the ordinary user's), without
    debootstrap's device nodes, as images are (kit build's, enroot import's): enroot's create mode cannot unpack
    one for an ordinary user (tests/test_local_users.py). Small: a container made from it takes seconds."""
    out = Path(user.pw_dir) / "debian.sqsh"
    subprocess.run(
        ["mksquashfs", str(debian_base), str(out), "-noappend", "-quiet", "-no-progress", "-comp", "lz4", *NO_DEVICES],
        check=True,
        timeout=600,
    )
    os.chown(out, user.pw_uid, user.pw_gid)
    return out


@pytest.fixture
def person(user, cluster, request) -> Person:
    """The ordinary user on the session's cluster, with a fresh directory of theirs for this test."""
    d = Path(user.pw_dir) / "tests" / request.node.name.translate(str.maketrans("[]/ ", "--__"))
    d.mkdir(parents=True)
    for path in (d.parent, d):
        os.chown(path, user.pw_uid, user.pw_gid)
    return Person(user, cluster.conf, d)


@pytest.fixture
def four_isolated(tmp_path):
    """A 4-node cluster of the test's own (2 CPUs a node), each node in its own network namespace behind a veth on
    one bridge (``--isolated-network``); ``.env`` its KIT_HOME."""
    from helpers import require

    require("slurmctld")
    require("tc")
    c = LocalCluster(tmp_path / "home4")
    c.up(nodes=4, cpus_per_node=2, isolated_network=True)
    c.env = {"KIT_HOME": str(c.home)}
    yield c
    c.down(force=True)


@pytest.fixture
def three(tmp_path):
    """A throw-away 3-node cluster of the test's own (its own KIT_HOME: ``c.env``), for a node to lose or spare."""
    require("slurmctld")
    home = tmp_path / "home3"
    c = LocalCluster(home)
    c.up(nodes=3, cpus_per_node=2)
    c.env = {"KIT_HOME": str(home)}
    yield c
    c.down(force=True)
