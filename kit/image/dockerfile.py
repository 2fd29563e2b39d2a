"""Dockerfiles as build recipes: the same internal steps as the TOML recipe.

Read as Docker's reference describes (parser directives ``# syntax=`` and
``# escape=``, comments, line continuations, ``RUN`` heredocs, shell and exec
forms, ``ARG``/``ENV`` substitution, stages with ``AS`` and ``--target``), for
the instructions that make an enroot image; every error names the file and
line, and nothing is built.

``FROM`` names a base the way ``kit build --base`` does (``rootfs:DIR``,
``tarball:FILE``, ``oci:DIR``, ``docker-archive:FILE``, ``squashfs:FILE``;
paths relative to the Dockerfile's directory), ``docker://...`` (pulled with
``enroot import``), ``scratch``, or an earlier stage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kit import files
from kit.errors import KitError
from kit.image import ignore as ignores
from kit.image import instructions as dock
from kit.image.instructions import IGNORED, NAME, Instruction
from kit.image.recipe import SOURCE_LIMIT, Base, Recipe, context_path, pip_requirements

BASE_PREFIXES = {
    "rootfs:": "rootfs",
    "tarball:": "tarball",
    "oci:": "oci",
    "docker-archive:": "docker-archive",
    "squashfs:": "squashfs",
}


@dataclass
class Stage:
    index: int
    name: str | None
    recipe: Recipe


class _Builder:
    """Turns a Dockerfile's instructions into one Recipe per stage."""

    def __init__(
        self, path: Path, label: str, build_args: dict[str, str], notice, base_roots: tuple[Path, ...] = ()
    ) -> None:
        self.path, self.label, self.where = path, label, path.parent
        self.base_roots = base_roots
        self.build_args = dict(build_args)
        self.used_args: set[str] = set()
        self.notice = notice
        self.stages: list[Stage] = []
        self.shell_entrypoint: set[int] = set()  # stages whose ENTRYPOINT is in shell form
        self.ignore = ignores.load(self.where)

    def add(self, recipe: Recipe, ins: Instruction, step: tuple) -> None:
        recipe.steps.append(step)
        recipe.step_labels.append(f"{self.label}:{ins.line}")

    def stage(self, ref: str) -> Stage | None:
        for s in self.stages:
            if s.name == ref.lower() or str(s.index) == ref:
                return s
        return None

    def base(self, ref: str, line: int) -> tuple[Base, dict[str, Recipe]]:
        earlier = self.stage(ref)
        if earlier:
            return Base("stage", earlier.name or str(earlier.index)), {
                earlier.name or str(earlier.index): earlier.recipe
            }
        if ref == "scratch":
            return Base("scratch", ""), {}
        if ref.startswith("docker://"):
            return Base("image", ref), {}
        for prefix, kind in BASE_PREFIXES.items():
            if ref.startswith(prefix):
                # Inside the build context, as COPY sources, or under a directory named on the command
                # line (--base-root): a Dockerfile must not pack host files it was not given.
                value = ref[len(prefix) :]
                for allowed in self.base_roots:
                    real = allowed.resolve()
                    path = (self.where / value).resolve()
                    if path == real or real in path.parents:
                        return Base(kind, str(path)), {}
                try:
                    path = context_path(self.where, value, f"{self.label}:{line}")
                except KitError as e:
                    raise KitError(
                        e.message.replace("copy source", f"FROM {prefix}"),
                        field=e.field,
                        hint="put the base inside the build context (a symlink to elsewhere does not "
                        "count), or name its directory with --base-root DIR",
                    ) from None
                return Base(kind, str(path)), {}
        raise dock.error(
            self.label,
            line,
            f"FROM {ref}: not a base kit can build from",
            hint="write FROM rootfs:DIR, tarball:FILE, oci:DIR, docker-archive:FILE, squashfs:FILE, "
            "docker://IMAGE, scratch, or an earlier stage's name",
        )

    def run(self, instructions: list[Instruction]) -> None:
        """Read the instructions in order, one method per instruction (``_from``, ``_run``, ...)."""
        self.global_args: dict[str, str] = {}
        self.recipe: Recipe | None = None
        self._new_stage()
        for ins in instructions:
            where = (self.label, ins.line)
            if ins.keyword not in ("FROM", "ARG"):
                if self.recipe is None:
                    raise dock.error(*where, f"{ins.keyword} before the first FROM")
                if ins.keyword in IGNORED:
                    self.notice(f"{self.label}:{ins.line}: {ins.keyword} means nothing to an enroot image: ignored")
                    continue
            handler = self.HANDLERS.get(ins.keyword)
            if handler is not None:
                handler(self, ins, where)
        unused = sorted(set(self.build_args) - self.used_args)
        if unused:
            self.notice(f"--build-arg {', '.join(unused)}: no ARG of that name in {self.label}")

    def _new_stage(self) -> None:
        """A stage's own state: its environment (ENV and ARG values), the ARG values its RUN
        steps see, which names ENV set, its SHELL and WORKDIR."""
        self.env: dict[str, str] = dict(self.global_args)
        self.stage_args: dict[str, str] = {}
        self.env_keys: set[str] = set()
        self.shell, self.workdir = ["/bin/sh", "-c"], "/"

    def _from(self, ins: Instruction, where) -> None:
        flags, rest = dock.flags(ins.text, (), *where)
        words = dock.substitute(rest, {**self.global_args}, *where).split()
        if len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS"):
            raise dock.error(*where, "FROM takes BASE [AS NAME]")
        name = words[2].lower() if len(words) == 3 else None
        if name and self.stage(name):
            raise dock.error(*where, f"a stage named {name!r} already exists")
        base, deps = self.base(words[0], ins.line)
        self.recipe = Recipe(path=self.path.resolve(), label=self.label, base=base, stages=dict(deps))
        self.stages.append(Stage(len(self.stages), name, self.recipe))
        self._new_stage()

    def _arg(self, ins: Instruction, where) -> None:
        recipe, env = self.recipe, self.env
        for word in dock.words(ins.text, *where):
            key, sep, default = word.partition("=")
            if not NAME.fullmatch(key):
                raise dock.error(*where, f"ARG: not a name: {key!r}")
            self.used_args.add(key)
            value = self.build_args.get(key, dock.substitute(default, env, *where) if sep else None)
            target = self.global_args if recipe is None else env
            if value is not None:
                target[key] = value
            elif key in self.global_args and recipe is not None:
                env[key] = self.global_args[key]  # ARG NAME after FROM takes the global value
            if recipe is not None and key in env:
                self.stage_args[key] = env[key]

    def _run(self, ins: Instruction, where) -> None:
        flags, text = dock.flags(ins.text, (), *where)
        argv = dock.exec_form(text)
        if ins.heredocs and re.fullmatch(r"(?:<<-?([\"']?)[A-Za-z_][A-Za-z0-9_]*\1\s*)+", text):
            argv = [*self.shell, ins.heredocs[0][1]]  # `RUN <<EOF`: the body is the script
        elif ins.heredocs:
            # `RUN cmd <<EOF`: the shell reads the body as cmd's stdin, as Docker runs it.
            argv = [*self.shell, text + "\n" + "".join(f"{body}{delim}\n" for delim, body in ins.heredocs)]
        elif argv is None:
            argv = [*self.shell, text]
        # Docker passes the stage's ARG values to RUN's environment (ENV wins over them);
        # they are part of the step, so of its cache key, and not kept in the image.
        args = {k: v for k, v in self.stage_args.items() if k not in self.env_keys}
        self.add(self.recipe, ins, ("run", {"argv": argv, "args": args} if args else argv))

    def _copy(self, ins: Instruction, where) -> None:
        """COPY and ADD (ADD also unpacks a local tar)."""
        recipe = self.recipe
        flags, text = dock.flags(
            ins.text,
            ("from", "chmod", "chown", "link") if ins.keyword == "COPY" else ("chmod", "chown", "link"),
            *where,
        )
        text = dock.substitute(text, self.env, *where)
        args = dock.exec_form(text) or dock.words(text, *where)
        if len(args) < 2:
            raise dock.error(*where, f"{ins.keyword} needs SRC... DEST")
        *sources, dest = args
        if not dest.startswith("/"):
            dest = str(Path(self.workdir) / dest) + ("/" if dest.endswith("/") else "")
        if len(sources) > 1 and not dest.endswith("/"):
            raise dock.error(*where, f"{ins.keyword} with several sources needs a DEST ending in /")
        chmod = flags.get("chmod")
        if chmod is not None and not re.fullmatch(r"[0-7]{3,4}", chmod):
            raise dock.error(*where, f"--chmod takes an octal mode, got {chmod!r}")
        if "chown" in flags:
            self.notice(
                f"{self.label}:{ins.line}: --chown: enroot images are packed with every file owned "
                "by root (mksquashfs -all-root), and jobs run as the submitting user: ignored"
            )
        for src in sources:
            if ins.keyword == "ADD" and re.match(r"[a-z]+://", src):
                raise dock.error(
                    *where,
                    f"ADD {src}: kit does not download while building (no network on the nodes that build)",
                    hint="download it first and COPY the file",
                )
            value = (
                self._from_stage(flags["from"], src, dest, where)
                if "from" in flags
                else self._from_context(ins, src, dest, where)
            )
            if chmod is not None:
                value["chmod"] = chmod
            self.add(recipe, ins, ("add", value))

    def _from_stage(self, ref: str, src: str, dest: str, where) -> dict:
        stage = self.stage(ref)
        if stage is None or stage.recipe is self.recipe:
            raise dock.error(
                *where,
                f"COPY --from={ref}: no earlier stage of that name",
                hint="name a stage with FROM ... AS NAME before this line",
            )
        key = stage.name or str(stage.index)
        self.recipe.stages[key] = stage.recipe
        return {"stage": key, "src": src, "dst": dest}

    def _from_context(self, ins: Instruction, src: str, dest: str, where) -> dict:
        if any(c in src for c in "*?["):
            raise dock.error(
                *where, f"{ins.keyword} {src}: wildcards are not supported", hint="name the files or their directory"
            )
        path = context_path(self.where, src, f"{self.label}:{ins.line}")
        if self.ignore.skips(path.relative_to(self.where.resolve()).as_posix(), path.is_dir()):
            raise dock.error(*where, f"{ins.keyword} {src}: excluded by .dockerignore")
        return {
            "src": str(path),
            "dst": dest,
            "ignore": self.ignore.patterns,
            "context": str(self.where.resolve()),
            "extract": ins.keyword == "ADD",
        }

    def _env(self, ins: Instruction, where) -> None:
        pairs = {k: dock.substitute(v, self.env, *where) for k, v in dock.pairs(ins.text, *where, "ENV").items()}
        for key in pairs:
            if not NAME.fullmatch(key):
                raise dock.error(*where, f"ENV: not a variable name: {key!r}")
        self.env.update(pairs)
        self.env_keys.update(pairs)
        self.add(self.recipe, ins, ("env", pairs))

    def _workdir(self, ins: Instruction, where) -> None:
        value = dock.substitute(ins.text, self.env, *where)
        self.workdir = value if value.startswith("/") else str(Path(self.workdir) / value)
        self.add(self.recipe, ins, ("workdir", self.workdir))

    def _label(self, ins: Instruction, where) -> None:
        self.recipe.labels.update(
            {k: dock.substitute(v, self.env, *where) for k, v in dock.pairs(ins.text, *where, "LABEL").items()}
        )

    def _entrypoint(self, ins: Instruction, where) -> None:
        """ENTRYPOINT and CMD."""
        recipe = self.recipe
        argv = dock.exec_form(ins.text)
        words = argv if argv is not None else [*self.shell, ins.text]
        # Docker: a shell-form ENTRYPOINT ignores CMD, wherever CMD is written.
        if ins.keyword == "ENTRYPOINT":
            recipe.entrypoint = words
            if argv is None:
                self.shell_entrypoint.add(id(recipe))
            else:
                self.shell_entrypoint.discard(id(recipe))
        else:
            recipe.cmd = words
        if id(recipe) in self.shell_entrypoint:
            recipe.cmd = []

    def _volume(self, ins: Instruction, where) -> None:
        vols = dock.exec_form(ins.text) or dock.words(dock.substitute(ins.text, self.env, *where), *where)
        self.recipe.volumes.extend(v for v in vols if v not in self.recipe.volumes)

    def _shell(self, ins: Instruction, where) -> None:
        argv = dock.exec_form(ins.text)
        if not argv:
            raise dock.error(*where, 'SHELL takes the exec form, e.g. SHELL ["/bin/bash", "-c"]')
        self.shell = argv

    def _kit(self, ins: Instruction, where) -> None:
        # kit's own steps, which a Dockerfile has no words for (docker stops at them: unknown
        # instruction): `KIT pip REQ...` installs with the host's pip into the image's Python
        # (no network or pip needed in the image), `KIT runtime` adds kit's runtime at /opt/kit.
        words = dock.words(dock.substitute(ins.text, self.env, *where), *where)
        if words[:1] == ["pip"] and len(words) > 1:
            self.add(self.recipe, ins, ("pip", pip_requirements(words[1:], self.where, f"{self.label}:{ins.line}")))
        elif words == ["runtime"]:
            self.add(self.recipe, ins, ("kit", True))
        else:
            raise dock.error(*where, f"KIT {ins.text}: expected `KIT pip REQUIREMENT...` or `KIT runtime`")

    def _user(self, ins: Instruction, where) -> None:
        user = dock.substitute(ins.text, self.env, *where)
        self.recipe.labels["kit.user"] = user
        self.notice(
            f"{self.label}:{ins.line}: USER {user}: enroot runs the container as the user who "
            "submits the job, and kit runs RUN steps as root; recorded as the label kit.user"
        )

    HANDLERS = {
        "FROM": _from,
        "ARG": _arg,
        "RUN": _run,
        "COPY": _copy,
        "ADD": _copy,
        "ENV": _env,
        "WORKDIR": _workdir,
        "LABEL": _label,
        "ENTRYPOINT": _entrypoint,
        "CMD": _entrypoint,
        "VOLUME": _volume,
        "SHELL": _shell,
        "KIT": _kit,
        "USER": _user,
    }


def load(
    path: str | Path,
    *,
    build_args: dict[str, str] | None = None,
    target: str | None = None,
    notice=lambda msg: None,
    base_roots: tuple[Path, ...] = (),
) -> Recipe:
    """The Recipe of ``target`` (default: the last stage) of the Dockerfile at ``path``;
    ``FROM`` paths lie in its directory (the context) or under one of ``base_roots``."""
    p = Path(path)
    label = str(path)
    try:  # a symlink is followed (the user named it), to a regular file of text only
        text = files.read_bytes(p, SOURCE_LIMIT, follow=True).decode("utf-8").removeprefix("\ufeff")  # a BOM, as Docker
    except FileNotFoundError:
        raise KitError(f"no such Dockerfile: {path}", field="DOCKERFILE") from None
    except OSError as e:
        raise KitError(f"cannot read: {e.strerror}", field=label) from None
    except UnicodeDecodeError as e:
        raise KitError(f"not UTF-8 text: {e}", field=label) from None
    if "\0" in text:
        raise KitError(
            f"line {text.count(chr(10), 0, text.index(chr(0))) + 1}: a NUL byte",
            field=label,
            hint="a Dockerfile is text; no path, value or command can hold a NUL byte",
        )
    builder = _Builder(p, label, build_args or {}, notice, tuple(Path(r) for r in base_roots))
    builder.run(dock.parse(text, label))
    if not builder.stages:
        raise KitError("no FROM instruction", field=label, hint="a Dockerfile starts with FROM BASE")
    if target is None:
        return builder.stages[-1].recipe
    stage = builder.stage(target)
    if stage is None:
        names = [s.name for s in builder.stages if s.name]
        raise KitError(
            f"no stage named {target!r}",
            field="--target",
            hint=("stages: " + ", ".join(names)) if names else "name stages with FROM ... AS NAME",
        )
    return stage.recipe
