"""kit build and kit inspect, on real mksquashfs,
with umoci and skopeo as the reference unpackers."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import kit, require
from images import CONFIG, docker_archive, oci_layout, tar_bytes, tiny_rootfs, tree

from kit.image import enroot, unpack
from kit.image.info import read_file


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def error_lines(stderr: str) -> list[str]:
    """stderr without the build's progress lines."""
    return [line for line in stderr.splitlines() if not line.startswith("kit: build: ")]


def write_recipe(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_rootfs(tmp_path_factory.mktemp("tiny") / "rootfs")


def umoci_unpack(layout: Path, dest: Path) -> Path:
    require("umoci")
    subprocess.run(["umoci", "raw", "unpack", "--image", f"{layout}:test", str(dest)], check=True, capture_output=True)
    return dest


def kit_unpack(kind: str, src: Path, dest: Path) -> unpack.ImageConfig:
    dest.mkdir()
    if kind == "oci":
        return unpack.unpack_oci(dest, src)
    return unpack.unpack_docker_archive(dest, src)


def test_oci_layout_unpacks_like_umoci(tmp_path):
    layout = oci_layout(tmp_path / "layout")
    ours = tmp_path / "ours"
    config = kit_unpack("oci", layout, ours)
    reference = umoci_unpack(layout, tmp_path / "reference")
    assert tree(ours) == tree(reference)
    t = tree(ours)
    assert "a/x" not in t and "gone-dir" not in t and "b/old" not in t and "b/sub" not in t
    assert t["b/new"][2] == b"new\n" and t["a/y"][1] == "0o640" and t["setuid"][1] == "0o4755"
    assert t["abs"] == ("symlink", "/etc/os-release") and t["c"][0] == "file"
    assert t["bin/tool2"][3] == t["bin/tool"][3] == t["bin/tool-link"][3] == "bin/tool"
    assert not (ours / "dev" / "null-ish").exists()  # enroot drops dev/*
    assert config.workdir == "/srv/app" and config.env == CONFIG["config"]["Env"]


def test_docker_archive_unpacks_like_skopeo_and_umoci(tmp_path):
    require("skopeo")
    archive = docker_archive(tmp_path / "image.tar")
    ours = tmp_path / "ours"
    config = kit_unpack("docker-archive", archive, ours)
    layout = tmp_path / "converted"
    subprocess.run(
        ["skopeo", "--insecure-policy", "copy", f"docker-archive:{archive}", f"oci:{layout}:test"],
        check=True,
        capture_output=True,
    )
    reference = umoci_unpack(layout, tmp_path / "reference")
    assert tree(ours) == tree(reference)
    assert config.entrypoint == ["/bin/tool", "--flag"] and config.volumes == ["/cache", "/var/data"]


ENROOT_RC = """# maintainer kit
# version 1

mkdir -p "/srv/app" 2> /dev/null
cd "/srv/app" && unset OLDPWD || exit 1

if [ -s /etc/rc.local ]; then
    . /etc/rc.local
fi

if [ $# -gt 0 ]; then
    exec '/bin/tool' '--flag' "$@"
else
    exec '/bin/tool' '--flag' 'it'\\''s' 'two words'
fi
"""


def test_metadata_files_match_what_enroot_writes(tmp_path):
    config = unpack.ImageConfig.from_oci(CONFIG)
    root = tmp_path / "root"
    enroot.write(root, config)
    assert (root / "etc" / "rc").read_text() == ENROOT_RC
    assert (root / "etc" / "environment").read_text() == "PATH=/usr/local/bin:/usr/bin:/bin\nGREETING=hello world\n"
    assert (root / "etc" / "fstab").read_text() == (
        "${ENROOT_ROOTFS}/cache /cache none x-create=dir,bind,rw,nosuid,nodev\n"
        "${ENROOT_ROOTFS}/var/data /var/data none x-create=dir,bind,rw,nosuid,nodev\n"
    )
    assert (root / "etc" / "rc.local").read_text() == enroot.RC_LOCAL
    assert (root / "srv" / "app").is_dir()
    # No entrypoint and no command: enroot runs /bin/sh; no labels: no comment block.
    bare = enroot.rc(unpack.ImageConfig())
    assert bare.startswith('mkdir -p "/" 2> /dev/null\n') and "    exec  '/bin/sh'\n" in bare
    assert '    exec  "$@"\n' in bare


@pytest.mark.parametrize("word", ["plain", "it's", "two words", "", "$HOME", "tab\there", "new\nline", "é"])
def test_exec_line_quoting_is_bash_at_q(word):
    """enroot writes the exec line with bash's ${array[@]@Q}: compare with bash itself."""
    out = subprocess.run(
        ["bash", "-c", 'a=("$1"); printf "%s" "${a[@]@Q}"', "_", word], capture_output=True, text=True
    ).stdout
    assert enroot.bash_at_q(word) == out


UNSAFE = {
    "dotdot": [("../escaped", "file", "x", 0o644)],
    "absolute": [("/tmp/kit-absolute-escape", "file", "x", 0o644)],
    "hardlink-out": [("h", "hardlink", "../../../etc/passwd", 0o644)],
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_unsafe_archives_are_refused_and_write_nothing_outside(tmp_path, case):
    outside = tmp_path / "outside"
    outside.mkdir()
    entries = [(n, k, (p.format(outside=outside) if isinstance(p, str) else p), m) for n, k, p, m in UNSAFE[case]]
    tarball = tmp_path / "base.tar"
    tarball.write_bytes(tar_bytes(entries))
    recipe = write_recipe(tmp_path / "r.toml", f'[base]\ntarball = "{tarball}"\n')
    before = {p.name for p in tmp_path.iterdir()}
    proc = kit("build", str(recipe), "-o", str(tmp_path / "out.sqsh"))
    assert proc.returncode == 2, proc.stderr
    assert error_lines(proc.stderr)[0].startswith(f"kit: {tarball}: archive member"), proc.stderr
    assert list(outside.iterdir()) == []
    assert not Path("/tmp/kit-absolute-escape").exists()
    assert not (tmp_path.parent / "escaped").exists()
    assert {p.name for p in tmp_path.iterdir()} == before  # no image, no leftover build directory


def _host_state(d: Path) -> dict:
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else None) for p in sorted(d.rglob("*"))}


def test_symlinks_in_a_base_redirect_writes_within_the_image_never_onto_the_host(tmp_path):
    """An untrusted base's symlinks to host paths (a file, a
    directory, an archive member under one) are resolved inside the image."""
    host = tmp_path / "host"
    (host / "dir").mkdir(parents=True)
    (host / "motd").write_text("host file\n")
    (host / "rc").write_text("host rc\n")
    before = _host_state(host)
    base = tmp_path / "base.tar"
    base.write_bytes(
        tar_bytes(
            [
                ("etc", "dir", None, 0o755),
                ("etc/motd", "symlink", f"{host}/motd", 0o777),
                ("etc/rc", "symlink", f"{host}/rc", 0o777),
                ("opt", "dir", None, 0o755),
                ("opt/app", "symlink", f"{host}/dir", 0o777),
                ("opt/rel", "symlink", "../../../../../../../..", 0o777),
                ("esc", "symlink", str(host / "dir"), 0o777),
                ("esc/planted-by-archive", "file", "x\n", 0o644),
            ]
        )
    )
    (tmp_path / "ctx" / "app").mkdir(parents=True)
    (tmp_path / "ctx" / "motd").write_text("image motd\n")
    (tmp_path / "ctx" / "app" / "planted").write_text("image app\n")
    recipe = write_recipe(
        tmp_path / "ctx" / "r.toml",
        f"""
[base]
tarball = "{base}"
[[steps]]
copy = ["motd", "/etc/motd"]
[[steps]]
copy = ["app", "/opt/app/"]
[[steps]]
copy = ["motd", "/opt/rel/{host.relative_to("/")}/dir/via-dotdot"]
""",
    )
    proc = kit("build", str(recipe), "-o", str(tmp_path / "out.sqsh"))
    assert proc.returncode == 0, proc.stderr
    assert _host_state(host) == before
    out = tmp_path / "out.sqsh"
    assert read_file(out, f"{host}/motd") == "image motd\n"  # the link's target, inside the image
    assert read_file(out, f"{host}/dir/app/planted") == "image app\n"
    assert read_file(out, f"{host}/dir/planted-by-archive") == "x\n"
    assert read_file(out, f"{host}/dir/via-dotdot") == "image motd\n"  # .. stops at the image's /
    assert read_file(out, "/etc/rc").startswith("mkdir -p")  # enroot's rc replaced the link


@pytest.mark.parametrize("source", ["../outside.txt", "ABS", "link-out", "sub/../../outside.txt"])
def test_copy_sources_outside_the_build_context_are_refused(tmp_path, tiny, source):
    """A recipe copies only from its own directory."""
    (tmp_path / "outside.txt").write_text("host secret\n")
    ctx = tmp_path / "ctx"
    (ctx / "sub").mkdir(parents=True)
    (ctx / "link-out").symlink_to(tmp_path / "outside.txt")
    source = str(tmp_path / "outside.txt") if source == "ABS" else source
    recipe = write_recipe(ctx / "r.toml", f'[base]\nrootfs = "{tiny}"\n[[steps]]\ncopy = ["{source}", "/x"]\n')
    proc = kit("build", str(recipe), "-o", str(tmp_path / "out.sqsh"))
    assert proc.returncode == 2, proc.stderr
    why = "is an absolute path" if source.startswith("/") else f"is outside the build context {ctx}"
    assert error_lines(proc.stderr)[0] == f"kit: {recipe}: steps[1]: copy source {source!r} {why}", proc.stderr
    assert not (tmp_path / "out.sqsh").exists()


def test_build_is_reproducible_cached_and_inspectable(tmp_path, tiny):
    (tmp_path / "payload").mkdir()
    (tmp_path / "payload" / "hello.txt").write_text("hello\n")
    recipe = write_recipe(
        tmp_path / "tiny.toml",
        f"""
description = "tiny test image"
[base]
rootfs = "{tiny}"
[[steps]]
copy = ["payload", "/opt/payload"]
[[steps]]
env = {{ GREETING = "hi there", PATH = "/bin" }}
[[steps]]
workdir = "/work"
[[steps]]
run = "mkdir -p /opt/made && echo made-in-image > /opt/made/marker && cat /opt/payload/hello.txt"
""",
    )
    a = kit("build", str(recipe), "-o", str(tmp_path / "a.sqsh"))
    assert a.returncode == 0, a.stderr
    assert a.stdout.startswith(f"{tmp_path / 'a.sqsh'}: built in ")
    assert "kit: build: [5/6] run: mkdir -p /opt/made" in a.stderr
    b = kit(
        "build",
        "--no-cache",
        str(recipe),
        "-o",
        str(tmp_path / "b.sqsh"),
        env={"KIT_HOME": str(tmp_path / "other-home")},
    )
    assert b.returncode == 0, b.stderr
    assert sha256(tmp_path / "a.sqsh") == sha256(tmp_path / "b.sqsh")

    mtime = (tmp_path / "a.sqsh").stat().st_mtime_ns
    again = kit("build", str(recipe), "-o", str(tmp_path / "a.sqsh"))
    assert again.returncode == 0 and ": up to date in " in again.stdout
    assert (tmp_path / "a.sqsh").stat().st_mtime_ns == mtime
    (tmp_path / "a.sqsh").unlink()
    cached = kit("build", str(recipe), "-o", str(tmp_path / "a.sqsh"))
    assert ": from cache in " in cached.stdout
    (tmp_path / "payload" / "hello.txt").write_text("changed\n")
    changed = kit("build", str(recipe), "-o", str(tmp_path / "a.sqsh"))
    assert ": built in " in changed.stdout
    assert sha256(tmp_path / "a.sqsh") != sha256(tmp_path / "b.sqsh")

    out = subprocess.run(
        ["unsquashfs", "-cat", str(tmp_path / "b.sqsh"), "opt/made/marker"], capture_output=True, text=True
    ).stdout
    assert out == "made-in-image\n"
    info = kit("inspect", "--json", str(tmp_path / "b.sqsh"))
    assert info.returncode == 0, info.stderr
    d = json.loads(info.stdout)
    assert d["env"] == ["GREETING=hi there", "PATH=/bin"] and d["workdir"] == "/work"
    assert d["compression"] == "lz4" and d["digest"]  # kit's default (read fastest through FUSE)
    lzo = kit("build", str(recipe), "-o", str(tmp_path / "lzo.sqsh"), "--compression", "enroot")
    assert lzo.returncode == 0, lzo.stderr
    assert (
        json.loads(kit("inspect", "--json", str(tmp_path / "lzo.sqsh")).stdout)["compression"]
        == "lzo (data blocks uncompressed: -noD)"
    )  # enroot's own options, exactly
    assert d["size"] == (tmp_path / "b.sqsh").stat().st_size
    env = subprocess.run(
        ["unsquashfs", "-cat", str(tmp_path / "b.sqsh"), "etc/environment"], capture_output=True, text=True
    ).stdout
    assert env == "GREETING=hi there\nPATH=/bin\n"
    assert not [p for p in tmp_path.iterdir() if ".build-" in p.name]


def test_bad_build_input(tmp_path, tiny):
    def build(text: str, *extra: str):
        recipe = write_recipe(tmp_path / "r.toml", text)
        return kit("build", str(recipe), "-o", str(tmp_path / "out.sqsh"), *extra)

    cases = [
        (
            '[base]\nrootfs = "/nonexistent/base"\n',
            f"kit: {tmp_path}/r.toml: base: rootfs base does not exist: /nonexistent/base",
        ),
        (f'bogus = 1\n[base]\nrootfs = "{tiny}"\n', f"kit: {tmp_path}/r.toml: unknown key 'bogus'"),
        (f'[base]\nrootfs = "{tiny}"\nbogus = 1\n', f"kit: {tmp_path}/r.toml: base: unknown key 'bogus' in [base]"),
        (
            f'[base]\nrootfs = "{tiny}"\n[[steps]]\nfrobnicate = "x"\n',
            f"kit: {tmp_path}/r.toml: steps[1]: unknown step 'frobnicate'",
        ),
    ]
    cases.append(
        ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", f"kit: {tmp_path}/r.toml: not valid TOML: nested too deep")
    )
    cases.append(
        (
            f'[base]\nrootfs = "{tiny}"\n[[steps]]\nrun = "echo a\\u0000b"\n',
            f"kit: {tmp_path}/r.toml: a value holds a NUL byte",
        )
    )
    corrupt = tmp_path / "corrupt.tar.gz"
    corrupt.write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(4000))
    cases.append((f'[base]\ntarball = "{corrupt}"\n', f"kit: {corrupt}: not a tar archive, or a corrupt one"))
    for text, message in cases:
        proc = build(text)
        assert proc.returncode == 2, proc.stderr
        assert error_lines(proc.stderr)[0].startswith(message), proc.stderr
        assert "Traceback" not in proc.stderr
        assert not (tmp_path / "out.sqsh").exists()

    failing = build(f'[base]\nrootfs = "{tiny}"\n[[steps]]\nrun = "echo about to fail; cat /no/such/file"\n')
    assert failing.returncode == 2
    lines = failing.stderr.splitlines()
    assert (
        f"kit: {tmp_path}/r.toml: steps[1] (run): step failed (exit 1): echo about to fail; cat /no/such/file" in lines
    )
    assert "  about to fail" in lines and any("/no/such/file" in line for line in lines[1:])
    assert not (tmp_path / "out.sqsh").exists()
    assert not [p for p in tmp_path.iterdir() if ".build-" in p.name]

    missing = kit("build", str(tmp_path / "nope.toml"), "-o", str(tmp_path / "out.sqsh"))
    assert (missing.returncode, missing.stderr.splitlines()[0]) == (
        2,
        f"kit: RECIPE: no such recipe: {tmp_path}/nope.toml",
    )
    # without enroot (a machine with one, e.g. after .ci/real-pyxis, would try the registry)
    no_enroot = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not os.path.exists(f"{d}/enroot"))
    recipe = write_recipe(tmp_path / "r.toml", '[base]\nimage = "docker://nvcr.io#nvidia/pytorch:24.08-py3"\n')
    registry = kit("build", str(recipe), "-o", str(tmp_path / "out.sqsh"), env={**os.environ, "PATH": no_enroot})
    assert registry.returncode == 2
    assert error_lines(registry.stderr)[0] == (
        f"kit: {tmp_path}/r.toml: base: cannot pull docker://nvcr.io#nvidia/pytorch:24.08-py3: enroot is not installed"
    )
    notsq = kit("inspect", str(tmp_path / "r.toml"))
    assert (notsq.returncode, notsq.stderr.splitlines()[0]) == (
        2,
        f"kit: IMAGE: not a squashfs image: {tmp_path}/r.toml",
    )


def test_oci_base_builds_an_image_with_its_config(tmp_path):
    layout = oci_layout(tmp_path / "layout")
    recipe = write_recipe(tmp_path / "r.toml", f'[base]\noci = "{layout}"\n[[steps]]\nenv = {{ EXTRA = "1" }}\n')
    proc = kit("build", str(recipe), "-o", str(tmp_path / "o.sqsh"))
    assert proc.returncode == 0, proc.stderr
    rc = subprocess.run(["unsquashfs", "-cat", str(tmp_path / "o.sqsh"), "etc/rc"], capture_output=True, text=True)
    assert rc.stdout == ENROOT_RC
    env = subprocess.run(
        ["unsquashfs", "-cat", str(tmp_path / "o.sqsh"), "etc/environment"], capture_output=True, text=True
    ).stdout
    assert env == "PATH=/usr/local/bin:/usr/bin:/bin\nGREETING=hello world\nEXTRA=1\n"
    # Extending it (a squashfs base) keeps its config.
    ext = write_recipe(
        tmp_path / "ext.toml", f'[base]\nsquashfs = "{tmp_path / "o.sqsh"}"\n[[steps]]\nworkdir = "/w2"\n'
    )
    proc = kit("build", str(ext), "-o", str(tmp_path / "ext.sqsh"))
    assert proc.returncode == 0, proc.stderr
    info = json.loads(kit("inspect", "--json", str(tmp_path / "ext.sqsh")).stdout)
    assert info["workdir"] == "/w2" and info["entrypoint"] == ["/bin/tool", "--flag"]
    assert info["env"][-1] == "EXTRA=1"


def test_the_output_must_be_a_regular_file(tmp_path, tiny):
    """kit build replaces its output: never a device node, a directory or a link's target."""
    recipe = write_recipe(tmp_path / "r.toml", f'[base]\nrootfs = "{tiny}"\n')
    target = tmp_path / "victim"
    target.write_text("keep me\n")
    (tmp_path / "link.sqsh").symlink_to(target)
    for out in ("/dev/full", str(tmp_path), str(tmp_path / "link.sqsh")):
        proc = kit("build", str(recipe), "-o", out)
        assert proc.returncode == 2, proc.stderr
        assert "is not a regular file" in error_lines(proc.stderr)[0] or "is a directory" in proc.stderr, proc.stderr
    assert target.read_text() == "keep me\n"
    assert os.path.exists("/dev/full") and not os.path.isfile("/dev/full")


def test_a_pip_step_says_what_it_collects_and_installs():
    """A pip step of torch is minutes: the build says each package pip collects, downloads and installs
    (kit.image.steps.SAY, the builder's progress), and keeps the whole output for a failure's message."""
    import sys

    from kit.image import steps

    said = []
    token = steps.SAY.set(said.append)
    try:
        code, out = steps._narrated(
            [
                sys.executable,
                "-c",
                "print('Collecting torch==2.13.0');"
                "print('  Downloading torch-2.13.0-cp311-none-linux_x86_64.whl (190.1 MB)');"
                "print('Requirement already satisfied: x');"
                "print('Installing collected packages: ' + ', '.join(['p%d' % i for i in range(40)]))",
            ],
            {"PATH": "/usr/bin:/bin"},
        )
    finally:
        steps.SAY.reset(token)
    assert code == 0 and out.count("\n") == 4
    assert said[:2] == [
        "pip: collecting torch==2.13.0",
        "pip: downloading torch-2.13.0-cp311-none-linux_x86_64.whl (190.1 MB)",
    ], said
    assert (
        len(said) == 3 and said[2].startswith("pip: installing collected packages p0, p1") and said[2].endswith("...")
    )
