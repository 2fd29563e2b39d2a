"""Build recipes: TOML files under containers/.

    description = "..."
    [base]                      # exactly one of:
    rootfs = "dir"              #   a root filesystem directory
    tarball = "rootfs.tar.gz"   #   a root filesystem tarball
    oci = "layout-dir"          #   an OCI image layout
    docker-archive = "img.tar"  #   `docker save` / `skopeo copy` output
    squashfs = "img.sqsh"       #   an existing image to extend
    image = "docker://[USER@][REGISTRY#]IMAGE[:TAG]"   # pulled with `enroot import`

    [[steps]]                   # each step has exactly one key:
    copy = ["src", "/dst"]      #   files from the recipe's directory into the image
    env = { KEY = "value" }     #   environment variables (carried into /etc/environment)
    workdir = "/workspace"      #   working directory
    run = "shell command"       #   run inside the image, in an isolated root
    pip = ["pkg==1.0"]          #   the host's pip installs into the image's Python (same minor version)
    kit = true                  #   kit's runtime (launcher helpers, trainer, exporter) at /opt/kit

    entrypoint = [...]; cmd = [...]; labels = {...}; volumes = [...]

Relative paths are relative to the recipe file. Unknown keys are errors.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit import files
from kit.errors import KitError
from kit.image import REGISTRY_REF

# mksquashfs options per --compression choice.
COMPRESSION = {
    "lz4": ["-comp", "lz4", "-b", "128K"],  # kit's default: read fastest through FUSE (bench/bench_pack.py)
    "zstd-fast": ["-comp", "zstd", "-Xcompression-level", "3", "-b", "1M"],  # smallest fast to pack and unpack
    "lz4-fast": ["-comp", "lz4", "-b", "1M"],
    "enroot": ["-comp", "lzo", "-noD"],  # enroot's default ENROOT_SQUASH_OPTIONS
    "lzo": ["-comp", "lzo"],
    "zstd": ["-comp", "zstd"],
    "gzip": ["-comp", "gzip"],
    "xz": ["-comp", "xz"],
    "none": ["-noI", "-noD", "-noF", "-noX"],
}
# Measured (bench/bench_pack.py): pyxis's squashfuse mode reads the image through FUSE at every
# job start, where zstd's decompression costs 2x lz4's; lz4 unpacks as fast for create mode.
DEFAULT_COMPRESSION = "lz4"
BASE_KINDS = ("rootfs", "tarball", "oci", "docker-archive", "squashfs", "image")
STEP_KINDS = ("copy", "env", "workdir", "run", "pip", "kit")
TOP_KEYS = ("description", "base", "steps", "entrypoint", "cmd", "labels", "volumes")


@dataclass(frozen=True)
class Base:
    kind: str
    value: str  # an absolute path, or the registry reference

    def describe(self) -> str:
        return f"{self.kind} {self.value}"


@dataclass
class Recipe:
    path: Path
    label: str  # the path as the user gave it, for messages
    base: Base
    steps: list[tuple[str, Any]] = field(default_factory=list)
    description: str = ""
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    labels: dict[str, str] = field(default_factory=dict)
    volumes: list[str] = field(default_factory=list)
    # Earlier Dockerfile stages this one builds on (base kind "stage") or copies from.
    stages: dict[str, Recipe] = field(default_factory=dict)
    # Where each step comes from, for messages (a Dockerfile's FILE:LINE); default steps[N].
    step_labels: list[str] = field(default_factory=list)

    def step_label(self, index: int, kind: str) -> str:
        if index < len(self.step_labels):
            return self.step_labels[index]
        return f"{self.label}: steps[{index + 1}] ({kind})"

    def as_dict(self) -> dict:
        """What the build digest covers (paths made relative to the recipe)."""
        return {
            "base": [self.base.kind, self.base.value],
            "steps": [list(s) for s in self.steps],
            "entrypoint": self.entrypoint,
            "cmd": self.cmd,
            "labels": self.labels,
            "volumes": self.volumes,
            "stages": {k: v.as_dict() for k, v in sorted(self.stages.items())},
        }


def parse_base(text: str, where: Path, label: str) -> Base:
    """``KIND=VALUE`` (from --base) or a table entry."""
    kind, sep, value = text.partition("=")
    if not sep or kind not in BASE_KINDS or not value:
        raise KitError(f"expected KIND=PATH, got {text!r}", field=label, hint="KIND is one of " + ", ".join(BASE_KINDS))
    return _base(kind, value, where, label)


def _base(kind: str, value: str, where: Path, label: str) -> Base:
    if kind == "image":
        if not REGISTRY_REF.match(value):
            raise KitError(
                f"not an image reference: {value!r}",
                field=label,
                hint="write docker://[USER@][REGISTRY#]IMAGE[:TAG], e.g. docker://nvcr.io#nvidia/pytorch:24.08-py3",
            )
        return Base(kind, value)
    path = (where / value).resolve() if not Path(value).is_absolute() else Path(value)
    return Base(kind, str(path))


SOURCE_LIMIT = 4 << 20  # a recipe or Dockerfile is text of a few kB; /dev/zero is not one


def _has_nul(value) -> bool:
    if isinstance(value, str):
        return "\0" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def load(path: str | Path, base_override: str | None = None) -> Recipe:
    p = Path(path)
    label = str(path)
    try:
        data = files.read_toml(p, SOURCE_LIMIT)
    except FileNotFoundError:
        raise KitError(
            f"no such recipe: {path}", field="RECIPE", hint="give a recipe file, e.g. containers/cpu-lightning.toml"
        ) from None
    except OSError as e:
        raise KitError(f"cannot read: {e.strerror}", field=label) from None
    except ValueError as e:
        raise KitError(f"not valid TOML: {e}", field=label) from None
    if _has_nul(data):
        raise KitError("a value holds a NUL byte (\\u0000)", field=label, hint="no path or command can hold one")
    where = p.resolve().parent
    for key in data:
        if key not in TOP_KEYS:
            raise KitError(f"unknown key {key!r}", field=label, hint="valid keys: " + ", ".join(TOP_KEYS))

    if base_override:
        base = parse_base(base_override, Path.cwd(), "--base")
    else:
        table = data.get("base")
        for key in table if isinstance(table, dict) else {}:
            if key not in BASE_KINDS:
                raise KitError(
                    f"unknown key {key!r} in [base]", field=f"{label}: base", hint="one of " + ", ".join(BASE_KINDS)
                )
        if not isinstance(table, dict) or len(table) != 1:
            raise KitError(
                "[base] needs exactly one of: " + ", ".join(BASE_KINDS),
                field=f"{label}: base",
                hint='e.g. a [base] table with the line rootfs = "bases/debian-bookworm"',
            )
        ((kind, value),) = table.items()
        if kind not in BASE_KINDS:
            raise KitError(
                f"unknown base kind {kind!r}", field=f"{label}: base", hint="one of " + ", ".join(BASE_KINDS)
            )
        if not isinstance(value, str):
            raise KitError(f"{kind} must be a string", field=f"{label}: base")
        base = _base(kind, value, where, f"{label}: base")

    steps = []
    raw_steps = data.get("steps", [])
    if not isinstance(raw_steps, list):
        raise KitError("steps must be an array of tables ([[steps]])", field=f"{label}: steps")
    for i, step in enumerate(raw_steps, 1):
        slabel = f"{label}: steps[{i}]"
        if not isinstance(step, dict) or len(step) != 1:
            raise KitError("a step has exactly one of: " + ", ".join(STEP_KINDS), field=slabel)
        ((kind, value),) = step.items()
        if kind not in STEP_KINDS:
            raise KitError(f"unknown step {kind!r}", field=slabel, hint="one of " + ", ".join(STEP_KINDS))
        steps.append((kind, _check_step(kind, value, where, slabel)))

    def str_list(key: str) -> list[str] | None:
        v = data.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise KitError(f"{key} must be a list of strings", field=f"{label}: {key}")
        return v

    labels = data.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise KitError("labels must be a table of strings", field=f"{label}: labels")
    return Recipe(
        path=p.resolve(),
        label=label,
        base=base,
        steps=steps,
        description=str(data.get("description", "")),
        entrypoint=str_list("entrypoint"),
        cmd=str_list("cmd"),
        labels=labels,
        volumes=str_list("volumes") or [],
    )


# A requirement as PEP 508 writes one, without a URL: NAME[extras] specifiers ; marker
REQUIREMENT = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[A-Za-z0-9._,\s-]*\])?"
    r"\s*(?:\(?\s*(?:(?:===|==|!=|~=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+\s*,?\s*)+\)?)?"
    r"\s*(?:;[^@]*)?"
)


def pip_requirements(values: list[str], context: Path, label: str) -> list[str]:
    """A pip step's words: requirements (``torch==2.13.0``, ``lightning>=2.2``) or wheel files
    in the build context, never pip options or URLs. The step installs binary wheels only, so
    no package's code runs on the building host (see :mod:`kit.image.builder`)."""
    out = []
    for value in values:
        if value.endswith(".whl") and not value.startswith("-"):
            out.append(str(context_path(context, value, label)))
        elif value.startswith("-") or not REQUIREMENT.fullmatch(value.strip()):
            raise KitError(
                f"not a requirement: {value!r}",
                field=label,
                hint="a pip step takes requirements (NAME, NAME==VERSION, NAME>=VERSION) and wheel "
                "files in the build context; no pip options, URLs or source trees (pip would "
                "run their code on this host: use a RUN step with the image's own pip)",
            )
        else:
            out.append(value.strip())
    return out


def context_path(context: Path, src: str, label: str) -> Path:
    """``src`` in the build context ``context``; refused when it names, or a
    symlink leads to, anything outside it (a recipe must not copy host files)."""
    real = context.resolve()
    path = (real / src).resolve()
    if os.path.isabs(src):
        raise KitError(
            f"copy source {src!r} is an absolute path",
            field=label,
            hint=f"write it relative to the build context {real}",
        )
    if path != real and real not in path.parents:
        raise KitError(
            f"copy source {src!r} is outside the build context {real}",
            field=label,
            hint="copy sources are relative paths inside the recipe's directory; "
            "put the file there (a symlink to elsewhere does not count)",
        )
    return path


def _check_step(kind: str, value: Any, where: Path, label: str) -> Any:
    if kind == "copy":
        if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
            raise KitError('copy takes ["SRC", "/DST"]', field=label)
        src, dst = value
        if not dst.startswith("/"):
            raise KitError(f"copy destination must be absolute, got {dst!r}", field=label)
        return [str(context_path(where, src, label)), dst]
    if kind == "env":
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise KitError('env takes a table of strings, e.g. env = { LANG = "C.UTF-8" }', field=label)
        for key in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise KitError(f"not a variable name: {key!r}", field=label)
        return dict(value)
    if kind in ("workdir", "run"):
        if not isinstance(value, str) or not value:
            raise KitError(f"{kind} takes a non-empty string", field=label)
        if kind == "workdir" and not value.startswith("/"):
            raise KitError(f"workdir must be absolute, got {value!r}", field=label)
        return value
    if kind == "pip":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise KitError('pip takes a list of requirements, e.g. pip = ["torch==2.13.0"]', field=label)
        return pip_requirements(value, where, label)
    if kind == "kit":
        if value is not True:
            raise KitError("kit takes true", field=label)
        return True
    raise AssertionError(kind)  # pragma: no cover
