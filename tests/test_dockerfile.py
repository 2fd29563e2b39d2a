"""`kit build` from a Dockerfile: the parser, its errors, and real builds
on the Debian base (stages, COPY --from, .dockerignore, --chmod, heredocs, ARG)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from helpers import REPO, kit, require

from kit.errors import KitError
from kit.image import dockerfile, ignore


def steps(text: str, tmp_path: Path, **kw):
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return dockerfile.load(path, **kw)


def test_parser_joins_lines_and_reads_both_forms(tmp_path):
    r = steps(
        "# syntax=docker/dockerfile:1\n"
        "FROM scratch\n"
        "RUN echo a \\\n"
        "# a comment inside the continuation is dropped\n"
        "    && echo b\n"
        'RUN ["/bin/echo", "exec form"]\n'
        'ENV A=1 B="two words"\n'
        "ENV LEGACY value with spaces\n"
        'SHELL ["/bin/bash", "-eu", "-c"]\n'
        "RUN echo $A\n"
        "WORKDIR /w\nWORKDIR sub\n"
        "ENTRYPOINT python3 -m app\n"
        'CMD ["--x"]\n'
        "VOLUME /data\n"
        'LABEL a=b "c d"=e\n',
        tmp_path,
    )
    assert r.steps == [
        ("run", ["/bin/sh", "-c", "echo a && echo b"]),
        ("run", ["/bin/echo", "exec form"]),
        ("env", {"A": "1", "B": "two words"}),
        ("env", {"LEGACY": "value with spaces"}),
        ("run", ["/bin/bash", "-eu", "-c", "echo $A"]),  # RUN text is the shell's, not substituted
        ("workdir", "/w"),
        ("workdir", "/w/sub"),
    ]
    # A shell-form ENTRYPOINT ignores CMD (Docker's rule), written before or after it.
    assert r.entrypoint == ["/bin/bash", "-eu", "-c", "python3 -m app"] and r.cmd == []
    assert r.volumes == ["/data"] and r.labels == {"a": "b", "c d": "e"}
    assert r.step_labels[0].endswith("Dockerfile:3") and r.step_labels[-1].endswith("Dockerfile:12")


def test_escape_directive_heredoc_args_and_targets(tmp_path):
    text = (
        "# escape=`\n"
        "ARG FLAVOUR=plain\n"
        "FROM scratch AS first\n"
        "ARG FLAVOUR\n"
        "ENV F=${FLAVOUR} G=${UNSET:-fallback} H=${FLAVOUR:+set}\n"
        "RUN echo one `\n"
        "    two\n"
        "FROM first AS second\n"
        "RUN <<EOF\n"
        "echo from a heredoc\n"
        "EOF\n"
    )
    r = steps(text, tmp_path)
    assert r.base.kind == "stage" and r.base.value == "first" and set(r.stages) == {"first"}
    assert r.steps == [("run", ["/bin/sh", "-c", "echo from a heredoc\n"])]
    first = steps(text, tmp_path, target="first", build_args={"FLAVOUR": "spicy"})
    assert first.steps[0] == ("env", {"F": "spicy", "G": "fallback", "H": "set"})
    # The stage's ARG reaches RUN's environment (Docker's rule), so its cache key too.
    assert first.steps[1] == ("run", {"argv": ["/bin/sh", "-c", "echo one two"], "args": {"FLAVOUR": "spicy"}})


BAD = [
    ("RUN true\n", "Dockerfile:1: RUN before the first FROM"),
    ("FROM scratch\nFOO bar\n", "Dockerfile:2: unknown instruction FOO"),
    (
        "FROM scratch\nADD https://example.com/x.tar /\n",
        "Dockerfile:2: ADD https://example.com/x.tar: kit does not download",
    ),
    ("FROM scratch\nCOPY --from=nope /a /b\n", "Dockerfile:2: COPY --from=nope: no earlier stage of that name"),
    ("FROM scratch\nCOPY *.py /app/\n", "Dockerfile:2: COPY *.py: wildcards are not supported"),
    ("FROM scratch\nCOPY ../outside /x\n", "Dockerfile:2: copy source '../outside' is outside the build context"),
    ("FROM scratch\nCOPY a b /dest\n", "Dockerfile:2: COPY with several sources needs a DEST ending in /"),
    ("FROM scratch\nCOPY /etc/passwd /x\n", "Dockerfile:2: copy source '/etc/passwd' is an absolute path"),
    ("FROM scratch\nCOPY sub/../../x /x\n", "Dockerfile:2: copy source 'sub/../../x' is outside the build context"),
    ("FROM scratch\nRUN --network=none true\n", "Dockerfile:2: unsupported flag --network"),
    ("FROM scratch\nRUN <<EOF\ntrue\n", "Dockerfile:2: heredoc <<EOF is not closed"),
    ("FROM busybox:latest\n", "Dockerfile:1: FROM busybox:latest: not a base kit can build from"),
    ("FROM scratch\nSHELL /bin/bash -c\n", "Dockerfile:2: SHELL takes the exec form"),
    ("FROM scratch AS a\nFROM scratch AS a\n", "Dockerfile:2: a stage named 'a' already exists"),
    ("FROM scratch\nCOPY a /x\0y\n", "Dockerfile: line 2: a NUL byte"),
    ("FROM scratch\nWORKDIR /a\0b\n", "Dockerfile: line 2: a NUL byte"),
    ("FROM scratch\n\nENV A=b\0c\n", "Dockerfile: line 3: a NUL byte"),
]


@pytest.mark.parametrize("text,message", BAD, ids=[m.split(": ", 1)[1][:30] for _, m in BAD])
def test_malformed_or_unsupported_instructions_name_the_line(tmp_path, text, message):
    (tmp_path / "Dockerfile").write_text(text)
    out = tmp_path / "out.sqsh"
    proc = kit("build", str(tmp_path), "-o", str(out))
    assert proc.returncode == 2, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith(f"kit: {tmp_path}/") and message in first, proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists() and list(tmp_path.iterdir()) == [tmp_path / "Dockerfile"]


def test_a_dockerfile_that_is_not_a_text_file_is_one_line(tmp_path):
    """A symlink to /dev/zero (read until memory ran out), a FIFO (blocked): one line, exit 2."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").symlink_to("/dev/zero")
    os.mkfifo(ctx / "fifo.Dockerfile")
    for name in ("Dockerfile", "fifo.Dockerfile"):
        proc = kit("build", str(ctx / name), "-o", str(tmp_path / "out.sqsh"), timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"kit: {ctx / name}: cannot read: ") and "Traceback" not in proc.stderr
        assert not (tmp_path / "out.sqsh").exists()


def test_target_and_build_arg_errors(tmp_path):
    with pytest.raises(KitError, match="no stage named 'x'"):
        steps("FROM scratch AS a\n", tmp_path, target="x")
    proc = kit(
        "build", str(REPO / "containers" / "cpu-lightning.toml"), "--build-arg", "A=1", "-o", str(tmp_path / "o")
    )
    assert proc.returncode == 2 and "kit: --build-arg: --build-arg is for Dockerfiles" in proc.stderr


def test_dockerignore_follows_docker():
    rules = ignore.Ignore(["*.md", "!README.md", "build", "**/*.pyc", "/data/tmp*"])
    assert [
        p
        for p in ["a.md", "README.md", "build/x/y", "src/a/b.pyc", "a.pyc", "data/tmp1", "data/x", "sub/a.md"]
        if rules.excluded(p)
    ] == ["a.md", "build/x/y", "src/a/b.pyc", "a.pyc", "data/tmp1"]


def listing(image: Path) -> dict[str, str]:
    out = subprocess.run(["unsquashfs", "-lls", str(image)], capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("squashfs-root"):
            rows[parts[5].split(" -> ")[0][len("squashfs-root") :] or "/"] = parts[0]
    return rows


def cat(image: Path, inner: str) -> str:
    return subprocess.run(["unsquashfs", "-cat", str(image), inner], capture_output=True, text=True, check=True).stdout


def test_a_multi_stage_dockerfile_builds(debian_base, kit_home, tmp_path):
    """Stages and COPY --from, .dockerignore, --chmod, --chown (ignored, said), a heredoc, ARG with
    --build-arg, exec-form ENTRYPOINT and CMD in enroot's /etc/rc, USER recorded, --target."""
    require("mksquashfs")
    ctx = tmp_path / "ctx"
    (ctx / "app" / "skipme").mkdir(parents=True)
    (ctx / "app" / "main.py").write_text("print('app')\n")
    (ctx / "app" / "notes.md").write_text("left out\n")
    (ctx / "app" / "skipme" / "x").write_text("left out\n")
    (ctx / "run.sh").write_text('#!/bin/sh\necho run "$@"\n')
    (ctx / ".dockerignore").write_text("app/skipme\n**/*.md\n")
    (ctx / "Dockerfile").write_text(
        f"ARG BASE=rootfs:{debian_base}\n"
        "FROM ${BASE} AS builder\n"
        "RUN echo built > /built.txt\n"
        "FROM $BASE\n"
        "ARG GREETING=hello\n"
        "ENV GREETING=${GREETING}\n"
        "RUN date +%s%N > /stamp\n"
        "WORKDIR /app\n"
        "COPY app/ ./\n"
        "COPY --from=builder /built.txt /opt/\n"
        "COPY --chmod=0750 --chown=nobody:nogroup run.sh /usr/local/bin/\n"
        "EXPOSE 80\n"
        "USER nobody\n"
        "RUN <<EOF\n"
        'echo "heredoc $GREETING" > /app/heredoc.txt\n'
        "EOF\n"
        'ENTRYPOINT ["/usr/local/bin/run.sh"]\n'
        'CMD ["--flag"]\n'
    )
    out = tmp_path / "app.sqsh"
    roots = ("--base-root", str(debian_base))  # FROM outside the context: named on the command line
    proc = kit("build", str(ctx), "-o", str(out), "--build-arg", "GREETING=hi", *roots, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "Dockerfile:12: EXPOSE means nothing to an enroot image: ignored" in proc.stderr
    assert "Dockerfile:13: USER nobody:" in proc.stderr
    rows = listing(out)
    assert {"/app/main.py", "/app/heredoc.txt", "/opt/built.txt", "/usr/local/bin/run.sh"} <= set(rows)
    assert not {"/app/notes.md", "/app/skipme"} & set(rows)  # .dockerignore
    assert rows["/usr/local/bin/run.sh"] == "-rwxr-x---"
    # enroot images are packed with every file owned by root (mksquashfs -all-root): --chown is said to be ignored.
    assert "Dockerfile:11: --chown: enroot images" in proc.stderr
    assert cat(out, "app/heredoc.txt") == "heredoc hi\n"
    rc = cat(out, "etc/rc")
    assert 'cd "/app"' in rc and "exec '/usr/local/bin/run.sh' '--flag'" in rc
    meta = json.loads(cat(out, ".kit/image.json"))
    assert meta["config"]["labels"]["kit.user"] == "nobody"
    # --target: the first stage alone.
    first = tmp_path / "builder.sqsh"
    proc = kit("build", str(ctx), "-o", str(first), "--target", "builder", *roots, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert cat(first, "built.txt") == "built\n" and "/app" not in listing(first)
    # Changing an ignored file changes nothing; an unchanged rebuild is up to date.
    (ctx / "app" / "notes.md").write_text("changed, still left out\n")
    again = kit("build", str(ctx), "-o", str(out), "--build-arg", "GREETING=hi", *roots, timeout=600)
    assert again.returncode == 0 and "up to date" in again.stdout, again.stdout + again.stderr
    # The per-instruction cache: a changed last RUN line runs that step alone (the earlier
    # RUN's timestamp is the same), on top of the cached layers.
    stamp = cat(out, "stamp")
    dockerfile_text = (ctx / "Dockerfile").read_text()
    (ctx / "Dockerfile").write_text(dockerfile_text.replace('"heredoc $GREETING"', '"heredoc changed $GREETING"'))
    changed = kit("build", str(ctx), "-o", str(out), "--build-arg", "GREETING=hi", *roots, timeout=600)
    assert changed.returncode == 0, changed.stderr
    progress = [line for line in changed.stderr.splitlines() if re.match(r"kit: build: \[\d+/\d+\] ", line)]
    assert [("cached:" in line) for line in progress[1:-1]] == [True] * 6 + [False], progress
    assert cat(out, "stamp") == stamp and cat(out, "app/heredoc.txt") == "heredoc changed hi\n"


def wheel(directory: Path, name: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel made by hand (pip installs it offline)."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-1.0.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = (
        "".join(
            f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
            f"{len(text.encode())}\n"
            for path, text in files.items()
        )
        + f"{info}/RECORD,,\n"
    )
    out = directory / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in {**files, f"{info}/RECORD": record}.items():
            z.writestr(path, text)
    return out


def test_pip_steps_compile_what_they_add_and_nothing_else(debian_base, kit_home, tmp_path):
    """`KIT pip` installs with --no-compile and compiles what it added on every core:
    checked-hash .pyc files (SOURCE_DATE_EPOCH) the image imports, a file that does not
    compile left as pip leaves it, and a second pip step leaves the first's files in
    their layer (nothing copied up)."""
    require("mksquashfs")
    one = wheel(
        tmp_path,
        "tiny_a",
        {"tiny_a/__init__.py": "VALUE = 'a'\n", "tiny_a/py312.py": "def f[T](x): ...\n", "tiny_a_top.py": "TOP = 1\n"},
    )
    two = wheel(tmp_path, "tiny_b", {"tiny_b/__init__.py": "from tiny_a import VALUE\n"})
    (tmp_path / "Dockerfile").write_text(
        f"FROM rootfs:{debian_base}\nKIT pip {one.name}\nKIT pip {two.name}\n"
        "RUN python3 -c 'import tiny_b, tiny_a_top; print(tiny_b.VALUE)'\n"
    )
    out = tmp_path / "pip.sqsh"
    proc = kit("build", str(tmp_path), "-o", str(out), "--base-root", str(debian_base), timeout=600)
    assert proc.returncode == 0, proc.stderr
    site = "/usr/local/lib/python3.11/dist-packages"
    rows = listing(out)
    for pyc in (
        "tiny_a/__pycache__/__init__.cpython-311.pyc",
        "tiny_b/__pycache__/__init__.cpython-311.pyc",
        "__pycache__/tiny_a_top.cpython-311.pyc",
    ):
        assert f"{site}/{pyc}" in rows, sorted(r for r in rows if "tiny" in r)
        flags = subprocess.run(
            ["unsquashfs", "-cat", str(out), f"{site}/{pyc}"], capture_output=True, check=True
        ).stdout[4:8]
        assert flags == b"\x03\x00\x00\x00", pyc  # hash-based, checked: the same bytes on every build
    assert f"{site}/tiny_a/__pycache__/py312.cpython-311.pyc" not in rows
    layers = Path(os.environ["KIT_HOME"]) / "cache" / "layers"
    holding = [d for d in layers.glob("*/diff") if (d / site.lstrip("/") / "tiny_a" / "__pycache__").exists()]
    assert len(holding) == 1, holding


def test_prune_keeps_the_cache_under_a_size(tmp_path):
    home = {"KIT_HOME": str(tmp_path / "home")}  # a cache of its own
    layers_dir = tmp_path / "home" / "cache" / "layers"
    for i, age in enumerate((300, 200, 100)):  # oldest first
        d = layers_dir / f"layer{i}" / "diff"
        d.mkdir(parents=True)
        (d / "blob").write_bytes(b"x" * 2**20)
        os.utime(d.parent, (time.time() - age, time.time() - age))
    proc = kit("build", "--prune", "--cache-size", "1.5M", env=home)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in layers_dir.iterdir()) == ["layer2"]  # the most recently used stays
    assert "kit: build: removed 2 cache entries (2.0 MiB)" in proc.stderr
    bad = kit("build", "--prune", "--cache-size", "lots", env=home)
    assert bad.returncode == 2 and "kit: --cache-size:" in bad.stderr


def test_a_symlink_out_of_the_context_is_refused(tmp_path):
    (tmp_path / "link").symlink_to("/etc")
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY link/passwd /x\n")
    proc = kit("build", str(tmp_path), "-o", str(tmp_path / "out.sqsh"))
    assert proc.returncode == 2 and f"kit: {tmp_path}/Dockerfile:2: copy source 'link/passwd' is outside" in proc.stderr
    assert not (tmp_path / "out.sqsh").exists()


def test_shell_form_entrypoint_and_cmd_in_enroots_rc(kit_home, tmp_path):
    """Docker's rules, as enroot's /etc/rc runs them: a shell-form ENTRYPOINT is
    /bin/sh -c TEXT and drops CMD; a shell-form CMD alone is /bin/sh -c TEXT."""
    (tmp_path / "a.txt").write_text("a\n")
    for name, lines, want in (
        (
            "ep",
            'ENTRYPOINT python3 -m app --port 80\nCMD ["ignored"]\n',
            "exec '/bin/sh' '-c' 'python3 -m app --port 80'",
        ),
        ("cmd", "CMD echo $HOME\n", "exec '/bin/sh' '-c' 'echo $HOME'"),
    ):
        (tmp_path / f"{name}.Dockerfile").write_text(f"FROM scratch\nCOPY a.txt /\n{lines}")
        out = tmp_path / f"{name}.sqsh"
        proc = kit("build", str(tmp_path), "-f", f"{name}.Dockerfile", "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        rc = cat(out, "etc/rc")
        assert re.search(r"exec +" + re.escape(want[len("exec ") :]), rc), rc
        assert "ignored" not in rc
