"""Building and inspecting images: a recipe into a reproducible squashfs image that enroot and pyxis run.

The build unpacks the base into a private root, applies the steps, writes
enroot's metadata files and kit's own ``/.kit/image.json``, and packs the
root with ``mksquashfs -all-root`` (zstd level 3 with 1 MiB blocks unless told
otherwise; ``enroot`` gives enroot's own ``-comp lzo -noD``), with fixed timestamps so the same recipe and inputs give the same
bytes. Builds are cached by a digest of everything that goes in (the recipe,
and the size and mtime of every input file): an unchanged rebuild is a no-op.
Nothing is left behind on failure; the image appears by an atomic rename.
"""

from __future__ import annotations

import errno
import hashlib
import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import kit
from kit import files
from kit.image import enroot, ignore, is_squashfs, layers, rootpath, runtime, unpack
from kit.image.recipe import COMPRESSION, DEFAULT_COMPRESSION, Recipe
from kit.home import kit_home
from kit.errors import KitError
from kit.runner import preexec, run, tail

METADATA = ".kit/image.json"


@dataclass
class BuildResult:
    image: Path
    digest: str
    built: bool  # False: the image was already up to date (or came from the cache)
    source: str  # "built", "up to date", "cache"


def cache_dir() -> Path:
    return kit_home() / "cache" / "images"


# ---------------------------------------------------------------- digests
def _fingerprint(path: Path) -> str:
    key = str(path)
    if key not in _FINGERPRINTS:  # one walk per path and build: stages share bases
        _FINGERPRINTS[key] = _walk_fingerprint(path)
    return _FINGERPRINTS[key]


_FINGERPRINTS: dict = {}


def _walk_fingerprint(path: Path) -> str:
    """A hash of names, types, modes, sizes and mtimes under ``path`` (a base root
    filesystem: not contents, as make does)."""
    if not path.exists() and not path.is_symlink():
        return f"missing {path}"
    if path.is_file() or path.is_symlink():
        st = path.lstat()
        return f"{path} {st.st_mode} {st.st_size} {st.st_mtime_ns}"
    # find(1) walks a 10k-file root filesystem several times faster than os.walk.
    out = run(["find", str(path), "-printf", "%y%m %s %T@ %P\\0"], what="build", timeout=None).stdout
    return hashlib.sha256("\0".join(sorted(out.split("\0"))).encode(errors="surrogateescape")).hexdigest()


def _source_fingerprint(src: Path, keep=None) -> str:
    """What a copy step copies: every entry's name, type, mode, size, mtime and, for
    files, content (as Docker keys COPY): a changed source rebuilds its step, even one
    whose size and mtime were kept. ``keep(relpath)``: the entries that count."""
    key = ("source", str(src), keep)
    if key in _FINGERPRINTS:
        return _FINGERPRINTS[key]
    h = hashlib.sha256()

    def entry(path: Path, rel: str) -> None:
        try:
            st = path.lstat()
        except OSError:
            h.update(f"missing {rel}\0".encode(errors="surrogateescape"))
            return
        h.update(f"{rel}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0".encode(errors="surrogateescape"))
        if stat.S_ISLNK(st.st_mode):
            h.update(os.readlink(path).encode(errors="surrogateescape"))
        elif stat.S_ISREG(st.st_mode):
            with open(path, "rb", buffering=0) as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)

    entry(src, "")
    if src.is_dir() and not src.is_symlink():
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames.sort()
            for name in sorted(dirnames + filenames):
                path = Path(dirpath) / name
                rel = path.relative_to(src).as_posix()
                if keep is None or keep(rel):
                    entry(path, rel)
    _FINGERPRINTS[key] = h.hexdigest()
    return _FINGERPRINTS[key]


def _add_fingerprint(value: dict) -> str:
    """A Dockerfile COPY/ADD source, as far as .dockerignore lets it in."""
    src = Path(value["src"])
    if not value.get("ignore"):
        return _source_fingerprint(src)
    rules = ignore.Ignore(value["ignore"])
    top = src.relative_to(value["context"]).as_posix()
    return _source_fingerprint(src, keep=lambda rel: not rules.excluded(f"{top}/{rel}" if rel else top))


def _step_extra(kind: str, value, stage_images: dict[str, Path]) -> str:
    """What a step's cache key holds beyond the step's own words: the content it copies."""
    if kind == "copy":
        return _source_fingerprint(Path(value[0]))
    if kind == "add":
        return str(stage_images[value["stage"]]) if "stage" in value else _add_fingerprint(value)
    if kind == "kit":
        return _runtime_hash()
    if kind == "pip":  # how a pip step lays out what it installs (console scripts on PATH since 0.x)
        return "pip-layout-2:" + SCRIPTS_DIR
    return ""


def digest(recipe: Recipe, compression: str) -> str:
    inputs = {"kit": kit.__version__, "recipe": recipe.as_dict(), "compression": compression}
    if recipe.base.kind not in ("image", "scratch", "stage"):
        inputs["base"] = _fingerprint(Path(recipe.base.value))
    inputs["copies"] = [_source_fingerprint(Path(v[0])) for k, v in recipe.steps if k == "copy"]
    inputs["adds"] = [_add_fingerprint(v) for k, v in recipe.steps if k == "add" and "stage" not in v]
    inputs["stages"] = {name: digest(stage, compression) for name, stage in sorted(recipe.stages.items())}
    if any(k == "kit" for k, _ in recipe.steps):
        inputs["kit_runtime"] = _runtime_hash()
    text = json.dumps(inputs, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------- image files
def read_file(image: Path, inner: str) -> str | None:
    """One file's text from inside a squashfs image (None if absent)."""
    proc = run(["unsquashfs", "-cat", str(image), inner], check=False, timeout=120)
    return proc.stdout if proc.returncode == 0 else None


def image_has(image: Path, paths: list[str]) -> set[str]:
    """Which of ``paths`` (relative to the image root) exist in the image."""
    proc = run(["unsquashfs", "-l", "-d", "/", str(image), *paths], check=False, timeout=120)
    if proc.returncode != 0 and not proc.stdout.strip():
        raise KitError(f"cannot read {image}: truncated or damaged (unsquashfs exit {proc.returncode})",
                       detail=tail(proc.stderr or ""), hint="build it again, or copy it again if it was copied")
    listed = {line.strip().lstrip("/") for line in proc.stdout.splitlines()}
    return {p for p in paths if p.strip("/") in listed}


def image_metadata(image: Path) -> dict | None:
    text = read_file(image, METADATA)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


# ---------------------------------------------------------------- isolation
# Docker's default capabilities for build steps, less MKNOD (a RUN step must not make a
# node for the host's disk): enough for apt, chown and setuid-to-a-user, nothing that mounts,
# loads modules, traces host processes or changes the host's clock or network.
STEP_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID",
             "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SYS_CHROOT", "CAP_KILL",
             "CAP_AUDIT_WRITE")


def isolate_argv(root: Path, env: dict[str, str], workdir: str = "/") -> list[str]:
    """bubblewrap's words that run a command inside ``root`` as a build step: its own PID,
    mount, IPC and UTS namespaces (``pivot_root`` into the image: no host path and no host
    process is reachable), a fresh ``/proc``, a minimal ``/dev``, ``/sys`` read-only, a
    private ``/tmp``, the host's network and DNS, only ``env``, Docker's default capabilities
    less MKNOD with no-new-privileges, and killed with kit (``--die-with-parent``)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise KitError("bwrap not found: build steps run in bubblewrap's isolation",
                       hint="install bubblewrap (apt-get install -y bubblewrap)", exit_code=1)
    argv = [bwrap, "--bind", str(root), "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL"]
    for cap in STEP_CAPS:
        argv += ["--cap-add", cap]
    if Path("/sys").is_dir():
        argv += ["--ro-bind", "/sys", "/sys"]
    if Path("/etc/resolv.conf").exists():
        # The file must exist in the image to be bound over (an empty one is left, as before).
        rootpath.directory(root, "/etc")
        target = rootpath.inside(root, "/etc/resolv.conf")
        if not target.exists() and not target.is_symlink():
            target.touch()
        if target.is_file() and not target.is_symlink():
            argv += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
    argv.append("--clearenv")
    for k, v in env.items():
        argv += ["--setenv", k, v]
    return [*argv, "--chdir", workdir, "--"]


def run_in_root(root: Path, argv: list[str], env: dict[str, str], label: str) -> subprocess.CompletedProcess:
    """Run ``argv`` inside ``root`` with only ``env``, isolated (:func:`isolate_argv`)."""
    try:
        full = [*isolate_argv(root, env), *argv]
    except KitError as e:
        raise KitError(e.message, field=label, hint=e.hint, exit_code=e.exit_code) from None
    return subprocess.run(full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace", preexec_fn=preexec())


def _image_env(config: unpack.ImageConfig) -> dict[str, str]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
           "SOURCE_DATE_EPOCH": "0", "LANG": "C.UTF-8"}
    for item in config.env:
        k, _, v = item.partition("=")
        env[k] = v
    return env


def _set_env(config: unpack.ImageConfig, key: str, value: str) -> None:
    for i, item in enumerate(config.env):
        if item.partition("=")[0] == key:
            config.env[i] = f"{key}={value}"
            return
    config.env.append(f"{key}={value}")


# ---------------------------------------------------------------- steps
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
    probe = ("import site, sys; print('%d.%d' % sys.version_info[:2]); "
             "print(([p for p in site.getsitepackages() if p.startswith('/usr/local')] or site.getsitepackages())[0]); "
             "print(sys.executable)")
    proc = run_in_root(root, ["python3", "-c", probe], _image_env(config), label)
    if proc.returncode != 0:
        raise KitError("the image has no working python3", field=label, detail=tail(proc.stdout),
                       hint="add Python to the base (e.g. debootstrap --include=python3-minimal)")
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
    dest = rootpath.directory(root, SCRIPTS_DIR)
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


def _step_pip(root: Path, packages: list[str], config, label: str) -> None:
    version, site_dir, python = _image_python(root, config, label)
    host = "%d.%d" % sys.version_info[:2]
    if version != host:
        raise KitError(f"the image's Python is {version}, this host's is {host}", field=label,
                       hint="a pip step installs with the host's pip, which needs the same minor version; "
                            "use a run step with the image's own pip instead")
    target = rootpath.directory(root, site_dir)
    before = set(os.listdir(target))
    # SOURCE_DATE_EPOCH: checked-hash .pyc files, the same on every build.
    env = {**os.environ, "SOURCE_DATE_EPOCH": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    # Binary wheels only: installing a wheel unpacks it, so no package's code (a setup.py, a
    # build backend) runs on this host as root. The requirements were checked when the
    # recipe was read (kit.image.recipe.pip_requirements): no pip options, URLs or sources.
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--no-warn-script-location", "--no-compile", "--only-binary", ":all:", "--target", str(target),
            "--", *packages]
    proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, preexec_fn=preexec())
    if proc.returncode != 0:
        raise KitError(f"pip install failed (exit {proc.returncode})", field=label, detail=tail(proc.stdout),
                       hint="a pip step installs binary wheels only (no package code runs on the building "
                            "host); for a package with no wheel, use a RUN step with the image's own pip")
    _place_scripts(root, target, python)
    # pip compiles one file at a time (most of its time for torch); compileall uses every
    # core, and only on what this step added (pip --target leaves existing entries alone).
    # A file that does not compile (torch ships Python 3.12-only test files) stays without
    # its .pyc, as pip leaves it.
    added = [str(target / name) for name in sorted(set(os.listdir(target)) - before)]
    if added:
        subprocess.run([sys.executable, "-m", "compileall", "-qq", "-j", "0", "-s", str(root), "-p", "/", *added],
                       env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       preexec_fn=preexec())


def _step_kit(root: Path, config, label: str) -> None:
    pydir = runtime.install(root)
    try:
        _, site_dir, _ = _image_python(root, config, label)
    except KitError:
        return  # no python in the image: the runtime is still there for the launcher's helpers
    site = rootpath.directory(root, site_dir)
    rootpath.write_text(root, rootpath.relative(root, site / runtime.PTH_NAME), rootpath.relative(root, pydir) + "\n")


# ---------------------------------------------------------------- build
def private_mounts() -> bool:
    """Move this process into a mount namespace of its own (as root), so every overlay a
    build mounts goes when the build's processes end, however they end (SIGKILL
    included). For the `kit build` command: its process does nothing else. False where
    it cannot (not root): the build then unmounts as it goes."""
    if os.geteuid() != 0:
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    CLONE_NEWNS, MS_REC, MS_PRIVATE = 0x00020000, 0x4000, 0x40000
    if libc.unshare(CLONE_NEWNS) != 0:
        return False
    # Nothing mounted here propagates back to the host's namespace.
    return libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0


def build(recipe: Recipe, output: Path, *, compression: str = DEFAULT_COMPRESSION, use_cache: bool = True,
          progress=lambda msg: None) -> BuildResult:
    """Build ``recipe`` into ``output`` (and its earlier stages into the cache)."""
    _FINGERPRINTS.clear()  # remembered for one build (its stages, built by _build, share bases), never longer
    try:
        with layers.Claim() as claim:
            return _build(recipe, output, compression=compression, use_cache=use_cache, progress=progress,
                          claim=claim)
    finally:
        _FINGERPRINTS.clear()


WORK_LOCK = ".lock"  # held (flock) by the build that owns a work directory


def _new_work_dir(output: Path) -> tuple[Path, int]:
    """The build's work directory next to the output (locked while it runs); the work
    directories of dead builds of the same output are removed first (unmounted, then deleted)."""
    prefix = f".{output.name}.build-"
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        for old in output.parent.iterdir():
            if old.name.startswith(prefix) and old.is_dir() and not old.is_symlink():
                try:
                    fd = os.open(old / WORK_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                except FileNotFoundError:
                    fd = None  # from an older kit, or killed before it locked: dead either way
                except OSError:
                    continue
                try:
                    if fd is not None:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a running build's
                finally:
                    if fd is not None:
                        os.close(fd)
                layers.remove(old)
        work = Path(tempfile.mkdtemp(prefix=prefix, dir=output.parent))
        fd = os.open(work / WORK_LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise KitError(f"cannot write in {output.parent}: {e.strerror}", field="--output",
                       hint="choose a directory on a writable filesystem with room for the image") from None
    fcntl.flock(fd, fcntl.LOCK_EX)
    return work, fd


def _build(recipe: Recipe, output: Path, *, compression: str, use_cache: bool, progress,
           claim: layers.Claim) -> BuildResult:
    if compression not in COMPRESSION:
        raise KitError(f"unknown compression {compression!r}", field="--compression",
                       hint="one of " + ", ".join(COMPRESSION))
    for tool in ("mksquashfs", "unsquashfs"):
        if shutil.which(tool) is None:
            raise KitError(f"{tool} not found", hint="install squashfs-tools (apt-get install -y squashfs-tools)",
                           exit_code=1)
    if output.is_symlink() or (output.exists() and not output.is_file()):
        # The image replaces the path: never a device node, a directory or a link's target.
        raise KitError(f"{output} exists and is not a regular file", field="--output",
                       hint="give a new path, or the path of an image to replace")
    _check_base(recipe)
    output = output.resolve()
    key = digest(recipe, compression)
    if output.exists() and is_squashfs(output):
        meta = image_metadata(output)
        if meta and meta.get("digest") == key:
            return BuildResult(output, key, False, "up to date")
    work, lock = _new_work_dir(output)
    cached = cache_dir() / f"{key}.sqsh"
    overlay = False
    root = work / "root"
    try:
        with layers.cache_lock():
            claim.add(cached.relative_to(layers.cache_root()).as_posix())
            hit = use_cache and cached.exists()
        if hit:
            _place(cached, output)
            return BuildResult(output, key, False, "cache")
        stage_images = _build_stages(recipe, compression, use_cache, progress, claim)
        root.mkdir()
        total = len(recipe.steps) + 2
        progress(f"[1/{total}] base: {recipe.base.describe()}")
        # Every step goes through the per-instruction cache where overlays can be mounted: a
        # TOML recipe and a Dockerfile with the same steps share their layers.
        config = _layered_root(recipe, root, work, progress, stage_images, total, use_cache, claim)
        overlay = config is not None
        if config is None:
            overlay = recipe.base.kind == "rootfs" and _mount_overlay(Path(recipe.base.value), work)
            config = _unpack_base(recipe, root, work, progress, copy=not overlay, stage_images=stage_images)
            for i, (kind, value) in enumerate(recipe.steps, 2):
                progress(f"[{i}/{total}] {kind}: {_shown(kind, value)}")
                _apply_step(root, kind, value, config, recipe.step_label(i - 2, kind), stage_images)
        _finish_config(recipe, config)
        _write_metadata(root, config, recipe, key, compression)
        progress(f"[{total}/{total}] mksquashfs ({compression}) -> {output}")
        packed = work / "image.sqsh"
        _mksquashfs(root, packed, compression)
        os.replace(packed, output)  # the image first: a full cache must not cost the user it
        if use_cache:
            with layers.cache_lock():
                claim.add(_partial(cached).relative_to(layers.cache_root()).as_posix())
            try:
                _place(output, cached)
            except OSError as e:
                progress(f"warning: the image is built, but not kept in the cache ({e.strerror}): "
                         f"{cached.parent}")
    finally:
        if overlay:
            run(["umount", "--lazy", str(root)], check=False)
        layers.remove(work)
        os.close(lock)
    return BuildResult(output, key, True, "built")


def _mount_overlay(base: Path, work: Path) -> bool:
    """Put ``work``/root over the rootfs ``base`` (an overlay), so the base is not copied.

    Steps write to ``work``/upper; the base is never changed. False where
    overlay mounts are not allowed (then the base is copied instead).
    """
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    (work / "upper").mkdir()
    (work / "ovl-work").mkdir()
    try:
        layers.mount([base], work / "upper", work / "ovl-work", work / "root")
    except KitError:  # a comma or colon in the path, or no overlay here
        return False
    return True


def _partial(dst: Path) -> Path:
    """Where :func:`_place` writes ``dst`` before renaming it into place."""
    return dst.with_name(f".{dst.name}.tmp{os.getpid()}")


def _place(src: Path, dst: Path) -> None:
    """Hard-link (or copy) ``src`` to ``dst`` atomically; nothing partial is left on failure."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _partial(dst)
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(src, tmp)  # never follows a name planted at tmp: it fails
        except OSError as e:
            if e.errno == errno.EEXIST:
                raise
            with open(src, "rb") as r, os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                                         | os.O_CLOEXEC, 0o644), "wb") as w:
                shutil.copyfileobj(r, w, 1 << 20)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _check_base(recipe: Recipe) -> None:
    b = recipe.base
    label = f"{recipe.label}: base"
    if b.kind in ("scratch", "stage"):
        return
    if b.kind == "image":
        if shutil.which("enroot") is None:
            raise KitError(f"cannot pull {b.value}: enroot is not installed", field=label,
                           hint="install enroot, or save the image (docker save / skopeo copy) and use it as "
                                "a docker-archive or oci base")
        return
    p = Path(b.value)
    if not p.exists():
        raise KitError(f"{b.kind} base does not exist: {p}", field=label,
                       hint="make it first (see containers/README.md), or pass --base KIND=PATH")
    want_dir = b.kind in ("rootfs", "oci")
    if want_dir != p.is_dir():
        raise KitError(f"{b.kind} base must be a {'directory' if want_dir else 'file'}: {p}", field=label)
    if b.kind == "squashfs" and not is_squashfs(p):
        raise KitError(f"not a squashfs image: {p}", field=label)


def _shown(kind: str, value) -> str:
    if kind == "copy":
        return f"{value[0]} -> {value[1]}"
    if kind == "add":
        return f"{value['stage'] + ':' if 'stage' in value else ''}{value['src']} -> {value['dst']}"
    return value if isinstance(value, str) else json.dumps(value)


def _layered_root(recipe: Recipe, root: Path, work: Path, progress, stage_images: dict[str, Path],
                  total: int, use_cache: bool, claim: layers.Claim) -> unpack.ImageConfig | None:
    """Every step from the layer cache, or run into a new layer (kit.image.layers);
    ``root`` ends as an overlay of them all over a scratch upper. None where
    overlays cannot be mounted (the caller then builds without the cache)."""
    if os.geteuid() != 0 or shutil.which("mount") is None or not layers.usable():
        return None
    b = recipe.base
    if b.kind == "rootfs":  # used in place, as the bottom layer
        parent = layers.key("base", [b.kind, b.value], _fingerprint(Path(b.value)))
        lowers = [Path(b.value)]
        config = unpack.ImageConfig(env=_read_environment(Path(b.value)))
    else:
        identity = str(stage_images[b.value]) if b.kind == "stage" else (
            "" if b.kind in ("scratch", "image") else _fingerprint(Path(b.value)))
        parent = layers.key("base", [b.kind, b.value], identity)
        config = layers.lookup(parent, claim) if use_cache else None
        if config is None:
            tmp = layers.new(claim)
            try:
                config = _unpack_base(recipe, tmp / "diff", work, progress, stage_images=stage_images)
            except BaseException:
                layers.discard(tmp)
                raise
            lowers = [layers.publish(tmp, parent, config, claim, replace=not use_cache)]
        else:
            lowers = [layers.diff(parent)]
    for i, (kind, value) in enumerate(recipe.steps, 2):
        step_key = layers.key(parent, [kind, value], _step_extra(kind, value, stage_images))
        cached = layers.lookup(step_key, claim) if use_cache else None
        if cached is not None:
            progress(f"[{i}/{total}] cached: {kind}: {_shown(kind, value)}")
            config = cached
            lowers.insert(0, layers.diff(step_key))
        else:
            progress(f"[{i}/{total}] {kind}: {_shown(kind, value)}")
            tmp = layers.new(claim)
            merged = work / f"step-{i}"
            merged.mkdir()
            try:
                layers.mount(lowers, tmp / "diff", tmp / "work", merged)
                try:
                    _apply_step(merged, kind, value, config, recipe.step_label(i - 2, kind), stage_images)
                finally:
                    layers.umount(merged)
            except BaseException:
                layers.discard(tmp)
                raise
            lowers.insert(0, layers.publish(tmp, step_key, config, claim, replace=not use_cache))
        parent = step_key
    (work / "upper").mkdir()
    (work / "ovl-work").mkdir()
    layers.mount(lowers, work / "upper", work / "ovl-work", root)
    _drop_dev(root)
    return config


def _drop_dev(root: Path) -> None:
    """``dev/*`` goes, as `enroot import` drops it."""
    dev = root / "dev"
    if dev.is_dir() and not dev.is_symlink():
        for child in dev.iterdir():
            rootpath.clear(child)


def _runtime_hash() -> str:
    h = hashlib.sha256()
    for p in runtime.package_files():
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _build_stages(recipe: Recipe, compression: str, use_cache: bool, progress,
                  claim: layers.Claim) -> dict[str, Path]:
    """Build the earlier Dockerfile stages ``recipe`` uses (kept in the cache,
    keyed by their digests): stage name -> image."""
    images = {}
    for name, stage in sorted(recipe.stages.items()):
        out = cache_dir() / "stages" / f"{digest(stage, compression)}.sqsh"
        progress(f"stage {name}:")
        with layers.cache_lock():
            claim.add(out.relative_to(layers.cache_root()).as_posix())
        _build(stage, out, compression=compression, use_cache=use_cache,
               progress=lambda msg, name=name: progress(f"  {name}: {msg}"), claim=claim)
        images[name] = out
    return images


def _unpack_base(recipe: Recipe, root: Path, work: Path, progress, copy: bool = True,
                 stage_images: dict[str, Path] | None = None) -> unpack.ImageConfig:
    b = recipe.base
    path = Path(b.value) if b.kind != "stage" else (stage_images or {})[b.value]
    if b.kind == "scratch":
        config = unpack.ImageConfig()
    elif b.kind == "rootfs":
        if copy:
            run(["cp", "-a", "--reflink=auto", f"{path}/.", str(root)], what="base", timeout=None)
        config = unpack.ImageConfig(env=_read_environment(root))
    elif b.kind == "tarball":
        unpack.unpack_tarball(root, path)
        config = unpack.ImageConfig(env=_read_environment(root))
    elif b.kind == "oci":
        config = unpack.unpack_oci(root, path, progress)
    elif b.kind == "docker-archive":
        config = unpack.unpack_docker_archive(root, path, progress)
    else:
        if b.kind == "image":
            path = work / "pulled.sqsh"
            run(["enroot", "import", "-o", str(path), b.value], what="base", timeout=None, stream=True)
        root.rmdir()
        run(["unsquashfs", "-no-progress", "-d", str(root), str(path)], what="base", timeout=None)
        meta = None
        meta_path = root / METADATA
        if meta_path.is_file():
            try:
                meta = json.loads(meta_path.read_text())
            except ValueError:
                meta = None
        if meta and isinstance(meta.get("config"), dict):
            config = unpack.ImageConfig(**meta["config"])
        else:
            config = unpack.ImageConfig(env=_read_environment(root))
    _drop_dev(root)
    return config


def _read_environment(root: Path) -> list[str]:
    path = root / "etc" / "environment"
    if path.is_file() and not path.is_symlink():
        return [line for line in path.read_text(errors="replace").splitlines()
                if "=" in line and not line.lstrip().startswith("#")]
    return []


def _apply_step(root: Path, kind: str, value, config: unpack.ImageConfig, label: str,
                stage_images: dict[str, Path] | None = None) -> None:
    if kind == "copy":
        _step_copy(root, value, label)
    elif kind == "add":
        from kit.image import add

        add.apply(root, value, label, (stage_images or {}).get(value.get("stage", "")))
    elif kind == "env":
        for k, v in value.items():
            _set_env(config, k, v)
    elif kind == "workdir":
        config.workdir = value
        rootpath.directory(root, value)
    elif kind == "run":
        if not (root / "bin" / "sh").exists() and not (root / "bin").is_symlink():
            raise KitError("the image has no /bin/sh to run steps with", field=label)
        env = _image_env(config)
        if isinstance(value, dict):  # a Dockerfile's RUN with ARG values: under the image's ENV
            env = {**_image_env(unpack.ImageConfig()), **value["args"], **env}
            value = value["argv"]
        workdir = config.workdir or "/"
        if isinstance(value, list):  # a Dockerfile's RUN: its shell (or exec form) words
            argv = ["/bin/sh", "-c", 'cd "$0" && exec "$@"', workdir, *value]
        else:
            argv = ["/bin/sh", "-c", f'cd "$0" && {value}', workdir]
        proc = run_in_root(root, argv, env, label)
        if proc.returncode != 0:
            shown = value if isinstance(value, str) else " ".join(value)
            raise KitError(f"step failed (exit {proc.returncode}): {shown}", field=label,
                           detail=tail(proc.stdout) or "(no output)")
    elif kind == "pip":
        _step_pip(root, value, config, label)
    elif kind == "kit":
        _step_kit(root, config, label)


def _finish_config(recipe: Recipe, config: unpack.ImageConfig) -> None:
    if recipe.entrypoint is not None:
        config.entrypoint = list(recipe.entrypoint)
    if recipe.cmd is not None:
        config.cmd = list(recipe.cmd)
    config.labels.update(recipe.labels)
    config.volumes = sorted(set(config.volumes) | set(recipe.volumes))


def _write_metadata(root: Path, config: unpack.ImageConfig, recipe: Recipe, key: str, compression: str) -> None:
    enroot.write(root, config)
    version_file = rootpath.inside(root, f"{runtime.IMAGE_PREFIX}/VERSION")
    meta = {
        "kit_version": kit.__version__,
        "digest": key,
        "recipe": recipe.path.name,
        "description": recipe.description,
        "base": recipe.base.kind,
        "compression": compression,
        "kit_runtime": version_file.read_text().strip() if version_file.is_file() else None,
        "config": asdict(config),
    }
    rootpath.write_text(root, METADATA, json.dumps(meta, indent=2, sort_keys=True) + "\n")


def _mksquashfs(root: Path, out: Path, compression: str) -> None:
    argv = ["mksquashfs", str(root), str(out), "-noappend", "-all-root", "-mkfs-time", "0", "-all-time", "0",
            "-processors", str(os.cpu_count() or 1), *COMPRESSION[compression]]
    tty = sys.stderr.isatty()
    if not tty:
        argv += ["-no-progress", "-quiet"]
    run(argv, what="mksquashfs", timeout=None, stream=tty)


# ---------------------------------------------------------------- inspect
@dataclass
class ImageInfo:
    path: Path
    size: int
    compression: str
    env: list[str]
    workdir: str
    entrypoint: list[str]
    cmd: list[str]
    digest: str | None
    kit_runtime: str | None


def inspect(image: Path) -> ImageInfo:
    if not image.exists():
        raise KitError(f"no such image: {image}", field="IMAGE")
    if not is_squashfs(image):
        raise KitError(f"not a squashfs image: {image}", field="IMAGE")
    proc = run(["unsquashfs", "-s", str(image)], what="unsquashfs")
    compression = "?"
    no_data = "Data is uncompressed" in proc.stdout
    for line in proc.stdout.splitlines():
        if line.startswith("Compression "):
            compression = line.split()[1] + (" (data blocks uncompressed: -noD)" if no_data else "")
    meta = image_metadata(image) or {}
    config = meta.get("config") or {}
    env = config.get("env")
    if env is None:
        env = [line for line in (read_file(image, "etc/environment") or "").splitlines() if line]
    version = meta.get("kit_runtime") or (read_file(image, "opt/kit/VERSION") or "").strip() or None
    return ImageInfo(path=image, size=image.stat().st_size, compression=compression, env=env,
                     workdir=config.get("workdir", ""), entrypoint=config.get("entrypoint", []),
                     cmd=config.get("cmd", []), digest=meta.get("digest"), kit_runtime=version)
