"""Hostile tars (ADD and base layers), Dockerfiles that try to
act on the host, stale copy layers, concurrent builds and --prune, Docker's ARG/heredoc/
.dockerignore/BOM rules, and builds stopped by TERM or KILL at random points.

Every build here runs on real overlay mounts, bubblewrap and mksquashfs."""

from __future__ import annotations

import io
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from helpers import kit, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from images import tiny_rootfs

from kit.errors import KitError
from kit.image import add, unpack
from kit.image.info import read_file


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny root with sh, cat, mkdir, ls and sleep."""
    root = tiny_rootfs(tmp_path_factory.mktemp("tiny-tools") / "rootfs")
    for tool in ("ls", "sleep"):
        host = Path(shutil.which(tool)).resolve()
        shutil.copy2(host, root / "bin" / tool)
        out = subprocess.run(["ldd", str(host)], capture_output=True, text=True).stdout
        for lib in [p for line in out.splitlines() for p in line.split() if p.startswith("/")]:
            target = root / lib.lstrip("/")
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(lib).resolve(), target)
    return root


def context(tmp_path: Path, tiny: Path, dockerfile: str, files: dict[str, bytes | str] | None = None) -> Path:
    """A build context holding the tiny root (as ``root``) and a Dockerfile."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    os.symlink(tiny, ctx / "root-link")  # a symlink out of the context does not count as inside
    shutil.copytree(tiny, ctx / "root", symlinks=True)
    for name, data in (files or {}).items():
        (ctx / name).parent.mkdir(parents=True, exist_ok=True)
        (ctx / name).write_bytes(data.encode() if isinstance(data, str) else data)
    (ctx / "Dockerfile").write_text(dockerfile)
    return ctx


def host_mounts(own: Path) -> list[str]:
    """The host's overlay mounts of this test's own directories (another test, or another session beside this
    one, mounts its own meanwhile)."""
    lines = Path("/proc/mounts").read_text().splitlines()
    return [line for line in lines if line.split()[2] == "overlay" and str(own) in line]


# ------------------------------------------------------------------ hostile tars
class Victim:
    """A host file and directory a hostile archive aims at: content, owner, mode and mtime."""

    def __init__(self, where: Path) -> None:
        self.dir = where / "victim-dir"
        self.dir.mkdir()
        self.file = where / "victim"
        self.file.write_text("precious\n")
        os.chmod(self.file, 0o600)
        os.utime(self.file, (1_500_000_000, 1_500_000_000))
        self.before = self.state()

    def state(self):
        st_ = self.file.lstat()
        return (
            self.file.read_bytes(),
            st_.st_uid,
            st_.st_gid,
            st_.st_mode,
            st_.st_mtime_ns,
            sorted(os.listdir(self.dir)),
            self.dir.lstat().st_mode,
        )


def _member(name: str, kind: str, link: str = "", data: bytes = b"", mode: int = 0o644, uid: int = 0):
    info = tarfile.TarInfo(name)
    info.mode, info.uid, info.gid, info.mtime = mode, uid, uid, 1_600_000_000
    if kind == "file":
        info.size = len(data)
        return info, io.BytesIO(data)
    info.type = {
        "dir": tarfile.DIRTYPE,
        "symlink": tarfile.SYMTYPE,
        "hardlink": tarfile.LNKTYPE,
        "chr": tarfile.CHRTYPE,
        "blk": tarfile.BLKTYPE,
        "fifo": tarfile.FIFOTYPE,
    }[kind]
    info.linkname = link
    if kind in ("chr", "blk"):
        info.devmajor, info.devminor = (1, 3) if kind == "chr" else (253, 0)
    return info, None


def hostile_members(victim: Victim):
    """Members aimed at the victim: every kind of escape a tar can try, by name or link."""
    up = "../" * 12
    targets = [
        str(victim.file),
        str(victim.dir),
        f"{up}{str(victim.file).lstrip('/')}",
        f"{up}{str(victim.dir).lstrip('/')}",
        "x",
        "d",
    ]
    names = [
        "x",
        "d",
        "d/x",
        "d/sub/x",
        "../x",
        f"{up}{str(victim.file).lstrip('/')}",
        str(victim.file),
        f"{str(victim.dir)}/planted",
        "./x",
        "d/../../x",
        "dev/x",
    ]
    return st.lists(
        st.one_of(
            st.tuples(
                st.sampled_from(names),
                st.just("file"),
                st.just(""),
                st.sampled_from([0o644, 0o755, 0o4755]),
                st.sampled_from([0, 4321]),
            ),
            st.tuples(
                st.sampled_from(names),
                st.sampled_from(["symlink", "hardlink"]),
                st.sampled_from(targets),
                st.sampled_from([0o777, 0o755]),
                st.sampled_from([0, 4321]),
            ),
            st.tuples(
                st.sampled_from(names),
                st.sampled_from(["dir", "chr", "blk", "fifo"]),
                st.just(""),
                st.just(0o755),
                st.just(0),
            ),
        ),
        min_size=1,
        max_size=6,
    )


def write_tar(path: Path, members) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, kind, link, mode, uid in members:
            info, data = _member(name, kind, link, b"PWNED BY ADD\n", mode, uid)
            tar.addfile(info, data)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_tars_never_change_a_host_file(tmp_path_factory, data):
    """Generated archives (hard links, symlinks, .., absolute names, device
    nodes, a name written through an earlier link) through ADD and as a base layer: the
    victim's content, owner, mode and mtime, and its directory, stay as they were."""
    where = tmp_path_factory.mktemp("hostile")
    victim = Victim(where)
    ctx = where / "ctx"
    ctx.mkdir()
    tarball = ctx / "evil.tar"
    write_tar(tarball, data.draw(hostile_members(victim)))
    for how in ("add", "base"):
        root = where / f"root-{how}"
        root.mkdir()
        try:
            if how == "add":
                add.apply(
                    root,
                    {"src": str(tarball), "dst": "/", "context": str(ctx), "ignore": [], "extract": True},
                    "Dockerfile:2",
                    None,
                )
            else:
                unpack.unpack_tarball(root, tarball)
        except KitError:
            pass  # refused: fine, as long as nothing outside changed
        assert victim.state() == victim.before, how
        for path in root.rglob("*"):  # nothing in the image is the victim itself
            if path.is_file() and not path.is_symlink():
                assert not os.path.samefile(path, victim.file), path


def test_a_member_under_an_earlier_file_is_refused_in_one_line(tmp_path):
    """Hypothesis found it: `d` a file, then `d/sub/x` (or `d/x`): refused as a broken archive
    (a KitError naming the member), through ADD and as a base layer, not an OSError traceback."""
    for second in ("d/x", "d/sub/x"):
        tarball = tmp_path / "broken.tar"
        write_tar(tarball, [("d", "file", "", 0o644, 0), (second, "file", "", 0o644, 0)])
        for how in ("add", "base"):
            root = tmp_path / f"root-{how}-{second.count('/')}"
            root.mkdir()
            with pytest.raises(KitError, match=f"cannot extract '{second}'"):
                if how == "add":
                    add.apply(
                        root,
                        {"src": str(tarball), "dst": "/", "context": str(tmp_path), "ignore": [], "extract": True},
                        "Dockerfile:2",
                        None,
                    )
                else:
                    unpack.unpack_tarball(root, tarball)


def test_add_of_a_hard_link_to_a_host_file_is_refused_in_one_line(tmp_path, tiny):
    """Two escapes, reproduced through `kit build`: a hard link to a host file then a
    regular member of the same name; a hard link with mode 0755 and uid 4321."""
    victim = Victim(tmp_path)
    up = "../" * 12 + str(victim.file).lstrip("/")
    for members in (
        [("x", "hardlink", up, 0o644, 0), ("x", "file", "", 0o644, 0)],
        [("x", "hardlink", up, 0o755, 4321)],
    ):
        shutil.rmtree(tmp_path / "ctx", ignore_errors=True)
        ctx = context(tmp_path, tiny, "FROM rootfs:root\nADD evil.tar /\n")
        write_tar(ctx / "evil.tar", members)
        proc = kit("build", str(ctx), "-o", str(tmp_path / "o.sqsh"))
        assert proc.returncode == 2, proc.stderr
        first = [line for line in proc.stderr.splitlines() if not line.startswith("kit: build: ")][0]
        assert first.startswith(f"kit: {ctx}/Dockerfile:2: evil.tar: archive member") and "Traceback" not in proc.stderr
        assert victim.state() == victim.before
        assert not (tmp_path / "o.sqsh").exists()


# ------------------------------------------------------------------ Dockerfile routes to the host
def test_a_dockerfile_cannot_reach_the_host(tmp_path, debian_base):
    """RUN cannot see host processes (/proc/<pid>/root), break out of its root
    (chroot escape), make a device node or write /sys; KIT pip takes no options, URLs or
    source trees; FROM cannot name a host directory outside the context."""
    victim = Victim(tmp_path)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    host_pid = os.getpid()
    escape = (
        "import os\n"
        f"p = '/proc/{host_pid}/root{victim.file}'\n"
        "print('proc-visible', os.path.exists(p))\n"
        "os.makedirs('/jail', exist_ok=True); os.chroot('/jail'); os.chdir('../../../../..'); os.chroot('.')\n"
        f"print('escaped', os.path.exists('{victim.file}'))\n"
        "try:\n    os.mknod('/disk', 0o600 | 0o060000, os.makedev(253, 0)); print('mknod ok')\n"
        "except OSError as e: print('mknod refused', e.errno)\n"
        "try:\n    open('/sys/kernel/mm/ksm/run', 'w').write('1'); print('sys written')\n"
        "except OSError as e: print('sys refused', e.errno)\n"
        "print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
    )
    (ctx / "escape.py").write_text(escape)
    (ctx / "Dockerfile").write_text("FROM rootfs:base\nCOPY escape.py /escape.py\nRUN python3 /escape.py > /out.txt\n")
    os.symlink(debian_base, ctx / "base")
    out = tmp_path / "o.sqsh"
    proc = kit("build", str(ctx), "-o", str(out), "--base-root", str(debian_base), timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = read_file(out, "out.txt")
    assert "proc-visible False" in report and "escaped False" in report, report
    assert "mknod refused" in report and "sys refused" in report, report
    pids = eval(report.split("pids ", 1)[1])
    assert max(pids) < 10, report  # its own PID namespace: a handful of processes
    assert victim.state() == victim.before
    # KIT pip: requirements only.
    (ctx / "setup.py").write_text(f"open({str(victim.file)!r}, 'w').write('PWNED')\n")
    for words in (f"--target {victim.dir} six", "--no-build-isolation .", "x @ file:///etc", "./", "-r req.txt"):
        (ctx / "Dockerfile").write_text(f"FROM rootfs:base\nKIT pip {words}\n")
        proc = kit("build", str(ctx), "-o", str(out), "--base-root", str(debian_base))
        assert proc.returncode == 2 and "not a requirement" in proc.stderr.splitlines()[0], (words, proc.stderr)
    assert victim.state() == victim.before
    # FROM a host directory.
    for ref in ("rootfs:/etc", f"rootfs:{victim.dir}", "tarball:../outside.tar", "rootfs:base"):
        (ctx / "Dockerfile").write_text(f"FROM {ref}\n")
        proc = kit("build", str(ctx), "-o", str(out))
        first = proc.stderr.splitlines()[0]
        assert proc.returncode == 2 and ("is outside the build context" in first or "is an absolute path" in first), (
            proc.stderr
        )


# ------------------------------------------------------------------ stale and shared layers
def test_a_changed_copy_source_rebuilds_its_step(tmp_path, tiny, kit_home):
    """Content, size or mtime of a TOML copy source changed: the step runs again."""
    ctx = tmp_path / "r"
    ctx.mkdir()
    (ctx / "payload.txt").write_text("one\n")
    recipe = ctx / "r.toml"
    recipe.write_text(
        f'[base]\nrootfs = "{tiny}"\n[[steps]]\ncopy = ["payload.txt", "/payload.txt"]\n'
        '[[steps]]\nrun = "cat /payload.txt > /seen"\n'
    )
    out = tmp_path / "o.sqsh"
    assert kit("build", str(recipe), "-o", str(out)).returncode == 0
    st0 = (ctx / "payload.txt").stat()
    for change, text in (("content", "two\n"), ("size", "three!\n"), ("mtime", "three!\n")):
        (ctx / "payload.txt").write_text(text)
        if change == "content":  # same size and mtime as before
            os.utime(ctx / "payload.txt", ns=(st0.st_atime_ns, st0.st_mtime_ns))
        if change == "mtime":
            os.utime(ctx / "payload.txt", (1_700_000_000, 1_700_000_000))
        proc = kit("build", str(recipe), "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        assert "cached: copy" not in proc.stderr, (change, proc.stderr)
        assert read_file(out, "payload.txt") == text and read_file(out, "seen") == text, change


def _start_build(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kit", "build", *args],
        stdout=subprocess.PIPE,
        stderr=open(log, "w"),
        text=True,
        start_new_session=True,
    )


def test_concurrent_builds_and_a_prune_share_the_cache(tmp_path, tiny, kit_home):
    """Two builds of one recipe 1 s apart both succeed with the same digest;
    `--prune --cache-size 0` during a build leaves it working."""
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'[base]\nrootfs = "{tiny}"\n'
        '[[steps]]\nrun = "sleep 2; echo a > /stepA"\n'
        '[[steps]]\nrun = "ls /stepA && sleep 2 && echo b > /stepB"\n'
        '[[steps]]\nrun = "ls /stepB && cat /stepA /stepB > /both"\n'
    )
    first = _start_build([str(recipe), "-o", str(tmp_path / "a.sqsh")], tmp_path / "a.log")
    wait_for(lambda: "[2/" in (tmp_path / "a.log").read_text(), 60, what="the first build inside its first step")
    second = _start_build([str(recipe), "-o", str(tmp_path / "b.sqsh")], tmp_path / "b.log")
    outs = [first.communicate(timeout=120)[0], second.communicate(timeout=120)[0]]
    assert first.returncode == 0 and second.returncode == 0, (tmp_path / "a.log").read_text() + (
        tmp_path / "b.log"
    ).read_text()
    digests = {line.rsplit("digest ", 1)[1] for line in outs}
    assert len(digests) == 1, outs
    # A prune while a build has its layers mounted.
    recipe.write_text(recipe.read_text().replace("echo a", "echo A"))
    build = _start_build([str(recipe), "-o", str(tmp_path / "c.sqsh")], tmp_path / "c.log")
    deadline = time.monotonic() + 60
    while "[3/5]" not in (tmp_path / "c.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    prune = kit("build", "--prune", "--cache-size", "0")
    assert prune.returncode == 0, prune.stderr
    build.communicate(timeout=120)
    assert build.returncode == 0, (tmp_path / "c.log").read_text()
    assert read_file(tmp_path / "c.sqsh", "both") == "A\nb\n"


# ------------------------------------------------------------------ Docker's rules
def test_arg_heredoc_dockerignore_and_bom_follow_docker(tmp_path, tiny, kit_home):
    text = (
        "\ufeffFROM rootfs:root\n"
        "ARG VERSION=1.2.3\n"
        'RUN echo "v=$VERSION" > /version\n'
        "RUN cat <<EOF > /etc/x\n"
        "hello $VERSION\n"
        "EOF\n"
        "COPY sub /sub\n"
    )
    ctx = context(
        tmp_path,
        tiny,
        text,
        {
            "sub/keep": "kept\n",
            "sub/drop": "dropped\n",
            "sub/deep/keep": "deep\n",
            ".dockerignore": "sub\n!sub/keep\n!sub/deep/keep\n",
        },
    )
    (ctx / "Dockerfile").write_bytes(text.encode("utf-8"))
    out = tmp_path / "o.sqsh"
    proc = kit("build", str(ctx), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert read_file(out, "version") == "v=1.2.3\n"  # ARG reaches RUN
    assert read_file(out, "etc/x") == "hello 1.2.3\n"  # the heredoc is cat's stdin
    assert read_file(out, "sub/keep") == "kept\n" and read_file(out, "sub/deep/keep") == "deep\n"
    assert read_file(out, "sub/drop") is None
    assert "VERSION" not in (read_file(out, "etc/environment") or "")  # not kept in the image
    proc = kit("build", str(ctx), "-o", str(out), "--build-arg", "VERSION=9")
    assert proc.returncode == 0 and "cached: run: " not in proc.stderr.split("[3/")[1], proc.stderr  # in the key
    assert read_file(out, "version") == "v=9\n"


# ------------------------------------------------------------------ stopped builds
def _leftovers(home: Path, outdir: Path) -> list[str]:
    layers = home / "cache" / "layers"
    found = [p.name for p in layers.iterdir() if p.name.startswith((".new-", ".old-"))] if layers.is_dir() else []
    found += [p.name for p in outdir.iterdir() if ".build-" in p.name]
    claims = home / "cache" / ".claims"
    found += [f"claim {p.name}" for p in claims.iterdir()] if claims.is_dir() else []
    images = home / "cache" / "images"
    found += [p.name for p in images.iterdir() if p.name.startswith(".")] if images.is_dir() else []
    return found


def _marked_processes(marker: str) -> list[str]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmd and state != "Z":
            out.append(f"{pid} {cmd!r}")
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_a_stopped_build_leaves_nothing_and_the_next_one_cleans_up(tmp_path, tiny, sig):
    """TERM or KILL at random points: nothing mounted, no process left; the
    next build and --prune remove every leftover. A RUN that ignores INT and TERM dies too."""
    home = tmp_path / "home"
    env = {**os.environ, "KIT_HOME": str(home)}
    marker = f"kitmark{os.getpid()}{sig}"
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'[base]\nrootfs = "{tiny}"\n'
        f'[[steps]]\nrun = "trap \\"\\" INT TERM; sleep 1.5; echo {marker} > /a"\n'
        f'[[steps]]\nrun = "trap \\"\\" INT TERM; sleep 1.5; echo {marker} > /b"\n'
    )
    mounts = host_mounts(tmp_path)
    rng = random.Random(int(sig))
    for delay in [rng.uniform(0.2, 4.0) for _ in range(3)]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kit", "build", str(recipe), "-o", str(tmp_path / "o.sqsh"), "--no-cache"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(delay)
        proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]
        assert proc.returncode in (0, -sig, 143), err
        if sig == signal.SIGTERM and proc.returncode == 143:
            assert "stopped by SIGTERM" in err and "Traceback" not in err, err
        deadline = time.monotonic() + 10
        while _marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _marked_processes(marker) == [], delay
        assert host_mounts(tmp_path) == mounts, delay
        if sig == signal.SIGTERM:
            assert [x for x in _leftovers(home, tmp_path) if not x.startswith("claim")] == [], delay
    # The next build and --prune remove what a killed build left.
    done = subprocess.run(
        [sys.executable, "-m", "kit", "build", str(recipe), "-o", str(tmp_path / "o.sqsh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    prune = subprocess.run(
        [sys.executable, "-m", "kit", "build", "--prune"], env=env, capture_output=True, text=True, timeout=60
    )
    assert prune.returncode == 0, prune.stderr
    assert _leftovers(home, tmp_path) == []
    assert host_mounts(tmp_path) == mounts


def test_a_full_cache_keeps_the_image(tmp_path, tiny):
    """ENOSPC while keeping the image in the cache: the image is there, the
    cache holds no partial file, and the build says so."""
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(home)], check=True)
    try:
        recipe = tmp_path / "r.toml"
        recipe.write_text(f'[base]\nrootfs = "{tiny}"\n[[steps]]\nrun = "echo x > /x"\n')
        out = tmp_path / "o.sqsh"
        proc = subprocess.run(
            [sys.executable, "-m", "kit", "build", str(recipe), "-o", str(out)],
            env={**os.environ, "KIT_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert "not kept in the cache" in proc.stderr
        assert read_file(out, "x") == "x\n"
        images = home / "cache" / "images"
        assert [p.name for p in images.iterdir()] == [] if images.is_dir() else True
    finally:
        subprocess.run(["umount", "--lazy", str(home)], check=False)
