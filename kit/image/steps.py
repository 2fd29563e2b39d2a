"""A recipe's steps, one small class per kind: how a step changes the image's root
(``apply``), how the build's progress names it (``describe``) and what its cache key holds
beyond the step's own words (``cache_key``: the content it copies). Every step that runs
code runs it inside the image, isolated (:func:`kit.image.isolate.isolate_argv`)."""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from kit import files
from kit.errors import KitError
from kit.image import fingerprint, rootpath, runtime, unpack
from kit.image.isolate import run_in_root
from kit.runner import preexec, tail


def image_env(config: unpack.ImageConfig) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "SOURCE_DATE_EPOCH": "0",
        "LANG": "C.UTF-8",
    }
    for item in config.env:
        k, _, v = item.partition("=")
        env[k] = v
    return env


def set_env(config: unpack.ImageConfig, key: str, value: str) -> None:
    for i, item in enumerate(config.env):
        if item.partition("=")[0] == key:
            config.env[i] = f"{key}={value}"
            return
    config.env.append(f"{key}={value}")


def _step_copy(root: Path, value, label: str) -> None:
    src, dst = Path(value[0]), value[1]
    if not src.exists() and not src.is_symlink():
        raise KitError(f"copy source does not exist: {src}", field=label)
    target = rootpath.inside(root, dst, follow_last=True)
    if dst.endswith("/") or target.is_dir():
        target = rootpath.inside(root, rootpath.relative(root, target / src.name))
    try:
        rootpath.copy_into(root, src, target)
    except KitError as e:
        raise KitError(e.message, field=label) from None


def _image_python(root: Path, config, label: str) -> tuple[str, str, str]:
    """(major.minor, site-packages dir, interpreter path) of the image's python3."""
    probe = (
        "import site, sys; print('%d.%d' % sys.version_info[:2]); "
        "print(([p for p in site.getsitepackages() if p.startswith('/usr/local')] or site.getsitepackages())[0]); "
        "print(sys.executable)"
    )
    proc = run_in_root(root, ["python3", "-c", probe], image_env(config), label)
    if proc.returncode != 0:
        raise KitError(
            "the image has no working python3",
            field=label,
            detail=tail(proc.stdout),
            hint="add Python to the base (e.g. debootstrap --include=python3-minimal)",
        )
    version, site_dir, python = proc.stdout.split()[-3:]
    return version, site_dir, python


SCRIPTS_DIR = "/usr/local/bin"


def _place_scripts(root: Path, target: Path, python: str) -> None:
    """Move the console scripts ``pip --target`` left in ``target/bin`` (torchrun, deepspeed,
    lightning, ...) onto the image's PATH, their ``#!`` line naming the image's python
    rather than the building host's."""
    bin_dir = target / "bin"
    if not bin_dir.is_dir() or bin_dir.is_symlink():
        return
    rootpath.directory(root, SCRIPTS_DIR)
    for script in sorted(bin_dir.iterdir()):
        if not script.is_file() or script.is_symlink():
            continue
        data = script.read_bytes()
        first, nl, rest = data.partition(b"\n")
        if first.startswith(b"#!") and b"python" in first:
            data = b"#!" + python.encode() + nl + rest
        out = rootpath.inside(root, f"{SCRIPTS_DIR}/{script.name}")
        rootpath.clear(out)
        files.create(out, data, 0o755)
        os.chmod(out, 0o755)  # not the umask's
    shutil.rmtree(bin_dir)


# Where a long step says what it does (the builder's progress, for the step it runs).
SAY: contextvars.ContextVar[Callable[[str], None]] = contextvars.ContextVar("say", default=lambda message: None)
_PIP_SAYS = re.compile(
    r"(Collecting|Processing|Downloading|Installing collected packages:|Successfully installed) ?(.*)"
)


def _narrated(argv: list[str], env: dict) -> tuple[int, str]:
    """pip's exit code and output, each package it collects, downloads and installs said as it goes (a
    torch install is minutes of silence otherwise)."""
    lines = []
    with subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        preexec_fn=preexec(),
    ) as proc:
        for line in proc.stdout:
            lines.append(line)
            m = _PIP_SAYS.match(line.strip())
            if m:
                what = m.group(2) if len(m.group(2)) <= 100 else m.group(2)[:97] + "..."
                SAY.get()(f"pip: {m.group(1).rstrip(':').lower()} {what}".rstrip())
    return proc.returncode, "".join(lines)


def _step_pip(root: Path, packages: list[str], config, label: str) -> None:
    version, site_dir, python = _image_python(root, config, label)
    host = "%d.%d" % sys.version_info[:2]
    if version != host:
        raise KitError(
            f"the image's Python is {version}, this host's is {host}",
            field=label,
            hint="a pip step installs with the host's pip, which needs the same minor version; "
            "use a run step with the image's own pip instead",
        )
    target = rootpath.directory(root, site_dir)
    before = set(os.listdir(target))
    # SOURCE_DATE_EPOCH: checked-hash .pyc files, the same on every build.
    env = {**os.environ, "SOURCE_DATE_EPOCH": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    # Binary wheels only: installing a wheel unpacks it, so no package's code (a setup.py, a
    # build backend) runs on this host as root. The requirements were checked when the
    # recipe was read (kit.image.recipe.pip_requirements): no pip options, URLs or sources.
    argv = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--progress-bar",
        "off",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--no-compile",
        "--only-binary",
        ":all:",
        "--target",
        str(target),
        "--",
        *packages,
    ]
    returncode, output = _narrated(argv, env)
    if returncode != 0:
        raise KitError(
            f"pip install failed (exit {returncode})",
            field=label,
            detail=tail(output),
            hint="a pip step installs binary wheels only (no package code runs on the building "
            "host); for a package with no wheel, use a RUN step with the image's own pip",
        )
    _place_scripts(root, target, python)
    # pip compiles one file at a time (most of its time for torch); compileall uses every
    # core, and only on what this step added (pip --target leaves existing entries alone).
    # A file that does not compile (torch ships Python 3.12-only test files) stays without
    # its .pyc, as pip leaves it.
    added = [str(target / name) for name in sorted(set(os.listdir(target)) - before)]
    if added:
        SAY.get()(f"compiling what pip added ({len(added)} entries) with every core")
        subprocess.run(
            [sys.executable, "-m", "compileall", "-qq", "-j", "0", "-s", str(root), "-p", "/", *added],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=preexec(),
        )


def _step_kit(root: Path, config, label: str) -> None:
    pydir = runtime.install(root)
    try:
        _, site_dir, _ = _image_python(root, config, label)
    except KitError:
        return  # no python in the image: the runtime is still there for the launcher's helpers
    site = rootpath.directory(root, site_dir)
    rootpath.write_text(root, rootpath.relative(root, site / runtime.PTH_NAME), rootpath.relative(root, pydir) + "\n")


def runtime_hash() -> str:
    h = hashlib.sha256()
    for p in runtime.package_files():
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


class Step:
    """A step kind: ``value`` is the step as the recipe holds it."""

    @staticmethod
    def apply(root: Path, value, config: unpack.ImageConfig, label: str, stage_images: dict[str, Path]) -> None:
        raise NotImplementedError

    @staticmethod
    def describe(value) -> str:
        return value if isinstance(value, str) else json.dumps(value)

    @staticmethod
    def cache_key(value, stage_images: dict[str, Path]) -> str:
        return ""


class Copy(Step):
    @staticmethod
    def apply(root, value, config, label, stage_images):
        _step_copy(root, value, label)

    @staticmethod
    def describe(value):
        return f"{value[0]} -> {value[1]}"

    @staticmethod
    def cache_key(value, stage_images):
        return fingerprint.of_source(Path(value[0]))


class Add(Step):
    @staticmethod
    def apply(root, value, config, label, stage_images):
        from kit.image import add

        add.apply(root, value, label, stage_images.get(value.get("stage", "")))

    @staticmethod
    def describe(value):
        return f"{value['stage'] + ':' if 'stage' in value else ''}{value['src']} -> {value['dst']}"

    @staticmethod
    def cache_key(value, stage_images):
        return str(stage_images[value["stage"]]) if "stage" in value else fingerprint.of_add(value)


class Env(Step):
    @staticmethod
    def apply(root, value, config, label, stage_images):
        for k, v in value.items():
            set_env(config, k, v)


class Workdir(Step):
    @staticmethod
    def apply(root, value, config, label, stage_images):
        config.workdir = value
        rootpath.directory(root, value)


class Run(Step):
    @staticmethod
    def apply(root, value, config, label, stage_images):
        if not (root / "bin" / "sh").exists() and not (root / "bin").is_symlink():
            raise KitError("the image has no /bin/sh to run steps with", field=label)
        env = image_env(config)
        if isinstance(value, dict):  # a Dockerfile's RUN with ARG values: under the image's ENV
            env = {**image_env(unpack.ImageConfig()), **value["args"], **env}
            value = value["argv"]
        workdir = config.workdir or "/"
        if isinstance(value, list):  # a Dockerfile's RUN: its shell (or exec form) words
            argv = ["/bin/sh", "-c", 'cd "$0" && exec "$@"', workdir, *value]
        else:
            argv = ["/bin/sh", "-c", f'cd "$0" && {value}', workdir]
        proc = run_in_root(root, argv, env, label)
        if proc.returncode != 0:
            shown = value if isinstance(value, str) else " ".join(value)
            raise KitError(
                f"step failed (exit {proc.returncode}): {shown}", field=label, detail=tail(proc.stdout) or "(no output)"
            )


class Pip(Step):
    @staticmethod
    def apply(root, value, config, label, stage_images):
        _step_pip(root, value, config, label)

    @staticmethod
    def cache_key(value, stage_images):  # how a pip step lays out what it installs (console scripts on PATH)
        return "pip-layout-2:" + SCRIPTS_DIR


class Kit(Step):
    @staticmethod
    def apply(root, value, config, label, stage_images):
        _step_kit(root, config, label)

    @staticmethod
    def cache_key(value, stage_images):
        return runtime_hash()


STEPS: dict[str, type[Step]] = {
    "copy": Copy,
    "add": Add,
    "env": Env,
    "workdir": Workdir,
    "run": Run,
    "pip": Pip,
    "kit": Kit,
}
