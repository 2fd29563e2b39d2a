"""What kit knows about pyxis: its srun flags, the mount syntax, the env rule.

Facts (pyxis 0.24 + enroot 4.1) this module encodes:
- the flags go on the srun step, not on sbatch (sbatch --container-image runs
  the batch script itself in the container, on the first node only);
- inside the container the image's variables overwrite the task's, except
  the names given to --container-env: every variable kit sets is listed;
- --container-mounts given twice keeps only the last: all mounts are joined
  into one flag; SRC[:DST[:FLAGS]], flags joined with '+', no escape for ','
  or ':', and paths with spaces fail; unknown flags are silently accepted by
  pyxis, so kit checks them; a missing SRC fails only at task start, so kit
  checks it on the submitting host.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from kit import files
from kit.errors import KitError
from kit.image import REGISTRY_REF, is_reference, is_squashfs

# Mount options kit lets through (enroot's bind-mount options).
MOUNT_FLAGS = (
    "ro",
    "rw",
    "private",
    "rprivate",
    "slave",
    "rslave",
    "shared",
    "rshared",
    "rbind",
    "nosuid",
    "nodev",
    "noexec",
)
SPECIAL_SOURCES = ("tmpfs", "umount")

# Variables prelaunch.sh sets for the step (kept in sync with the template by a test).
JOB_VARIABLES = (
    "KIT_CONTAINER",
    "KIT_EXPORTER_PORTS",
    "KIT_FINISHED_FILE",
    "KIT_JOB_DIR",
    "KIT_LOG_DIR",
    "KIT_PROMETHEUS_TARGETS",
    "KIT_RESTART",
    "KIT_WARNING_SIGNAL",
    "KIT_CHECKPOINT_STEP_FILE",
    "KIT_HANG_TIMEOUT",
    "KIT_FIRST_PROGRESS_TIMEOUT",
    "KIT_PROGRESS_DIR",
    "KIT_HANG_DIR",
    "MASTER_ADDR",
    "MASTER_PORT",
    "DEBUG",
    "PYTHONFAULTHANDLER",
    "NCCL_DEBUG",
    "TORCH_DISTRIBUTED_DEBUG",
    "CUDA_LAUNCH_BLOCKING",
    # The job's one tracker run (kit::tracker_env).
    "KIT_TRACKER_DIR",
    "KIT_RESUME_STEP",
    "WANDB_RUN_ID",
    "WANDB_RESUME",
    "WANDB_NAME",
    "WANDB_DIR",
    "WANDB__TRANSACTION_LOG_FLUSH_INTERVAL",
    "MLFLOW_RUN_ID",
    "MLFLOW_ALLOW_FILE_STORE",
)


@dataclass(frozen=True)
class Mount:
    src: str
    dst: str
    flags: tuple[str, ...] = ()

    def render(self) -> str:
        return ":".join([self.src, self.dst] + (["+".join(self.flags)] if self.flags else []))


def check_mount_path(path: str, what: str, label: str) -> None:
    for ch, name in ((",", "a comma"), (":", "a colon"), (" ", "a space")):
        if ch in path:
            raise KitError(
                f"{what} contains {name}: {path!r}",
                field=label,
                hint="pyxis has no escape for ',' or ':' and fails on spaces: use a path without them "
                "(a symlink to it works)",
            )
    if any(c in path for c in "\t\n\r"):
        raise KitError(f"{what} contains a control character: {path!r}", field=label)


def parse_mount(text: str, label: str = "--mount", check_source: bool = True) -> Mount:
    """``SRC:DST[:FLAGS]`` as kit accepts it (stricter than pyxis)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise KitError(
            f"expected SRC:DST[:FLAGS], got {text!r}", field=label, hint="e.g. --mount /data/imagenet:/data:ro"
        )
    src, dst = parts[0], parts[1]
    flags = tuple(f for f in parts[2].split("+") if f) if len(parts) == 3 else ()
    if src not in SPECIAL_SOURCES:
        if not src.startswith("/"):
            raise KitError(
                f"mount source must be an absolute path: {src!r}",
                field=label,
                hint=f"write it from the root, e.g. {os.path.abspath(src)}",
            )
        check_mount_path(src, "mount source", label)
    if not dst.startswith("/"):
        raise KitError(f"mount destination must be an absolute path: {dst!r}", field=label)
    if posixpath.normpath(dst) in ("/", "//"):
        raise KitError(
            f"a mount over the container's root is not possible: {text!r}",
            field=label,
            hint="mount it at a directory, e.g. /data",
        )
    check_mount_path(dst, "mount destination", label)
    for flag in flags:
        if flag not in MOUNT_FLAGS:
            raise KitError(
                f"unknown mount flag {flag!r} in {text!r}",
                field=label,
                hint="known flags: " + ", ".join(MOUNT_FLAGS) + " (join several with +)",
            )
    if "ro" in flags and "rw" in flags:
        raise KitError(f"both ro and rw in {text!r}", field=label)
    if check_source and src not in SPECIAL_SOURCES and not os.path.exists(src):
        raise KitError(
            f"source does not exist: {src}",
            field=label,
            hint="kit checks sources on this host; a node-local path must exist here too (or pass --no-mount-check)",
        )
    return Mount(src, dst, flags)


def covers(dst: str, path: str) -> bool:
    """Whether a mount at ``dst`` hides ``path`` or lands inside it."""
    dst, path = posixpath.normpath(dst), posixpath.normpath(path)
    return dst == path or path.startswith(dst.rstrip("/") + "/") or dst.startswith(path + "/")


def check_image(image: str, label: str = "--image") -> str:
    """A registry reference, or an absolute path of a squashfs file (returned absolute)."""
    if is_reference(image):
        if not REGISTRY_REF.match(image):
            raise KitError(
                f"not an image reference: {image!r}",
                field=label,
                hint="write docker://[USER@][REGISTRY#]IMAGE[:TAG] or the path of a .sqsh",
            )
        return image
    path = Path(image).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    check_mount_path(str(path), "image path", label)
    if not path.is_file():
        raise KitError(f"no such image: {path}", field=label, hint="build one with: kit build RECIPE -o IMAGE.sqsh")
    if not is_squashfs(path):
        raise KitError(
            f"not a squashfs image: {path}",
            field=label,
            hint="pyxis runs squashfs files (kit build makes them) or docker:// references",
        )
    return str(path)


def srun_flags(
    *,
    image: str,
    mounts: list[Mount],
    workdir: str | None,
    name: str | None,
    writable: bool,
    mount_home: bool,
    remap_root: bool,
) -> list[str]:
    """The container flags of the step; --container-env is added at run time by prelaunch."""
    flags = [f"--container-image={image}"]
    if mounts:
        flags.append("--container-mounts=" + ",".join(m.render() for m in mounts))
    if workdir:
        flags.append(f"--container-workdir={workdir}")
    if name:
        flags.append(f"--container-name={name}")
    if writable:
        flags.append("--container-writable")
    flags.append("--container-mount-home" if mount_home else "--no-container-mount-home")
    if remap_root:
        flags.append("--container-remap-root")
    return flags


def check_container(spec, origins) -> tuple[str, list[Mount]]:
    """A resolved job spec's image and mounts as pyxis takes them: the image
    checked, every mount parsed, and the paths kit mounts itself (the job's
    output directory, the Prometheus targets directory) checked against
    pyxis's mount syntax. ``origins`` names the fields as the user spelled them."""
    image = check_image(spec.image, origins.label("image"))
    mounts = [parse_mount(m, origins.label("mounts"), check_source=spec.mount_check) for m in spec.mounts]
    parse_mount(f"{spec.output_dir}:{spec.output_dir}", origins.label("output_dir"), check_source=False)
    if spec.prometheus_targets and spec.exporter:
        check_mount_path(
            spec.prometheus_targets,
            "the targets directory (mounted into the container)",
            origins.label("prometheus_targets"),
        )
    return image, mounts


# The container kit names where the site's pyxis removes a job's named containers in its job epilog.
KIT_CONTAINER = "kit"


def plugstack_settings(path: Path, _depth: int = 0) -> dict[str, str] | None:
    """The ``KEY=VALUE`` settings on pyxis's line of a plugstack.conf (its ``include``s followed); None
    when the file cannot be read here (a configless site's login node) or loads no pyxis."""
    try:
        text = files.read_text(path, 1 << 20)
    except (OSError, UnicodeError):
        return None
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) >= 2 and words[0] == "include" and _depth < 4:
            pattern = words[1] if os.path.isabs(words[1]) else str(path.parent / words[1])
            for found in sorted(Path("/").glob(pattern.lstrip("/"))):
                settings = plugstack_settings(found, _depth + 1)
                if settings is not None:
                    return settings
        elif len(words) >= 2 and words[0] in ("required", "optional") and "pyxis" in Path(words[1]).name:
            return dict(w.split("=", 1) for w in words[2:] if "=" in w)
    return None


def epilog_removes(settings: dict[str, str] | None) -> bool:
    """Whether a named container is removed by pyxis's job epilog, out of the job's steps, where an unnamed
    one costs its step an ``enroot remove``: ``container_scope=job`` in create mode (in squashfuse mode an
    unnamed container is started from the image directly and has nothing to remove)."""
    if not settings or settings.get("container_scope") != "job":
        return False
    return settings.get("use_squashfuse", "0").lower() not in ("1", "true", "yes", "y", "on")
