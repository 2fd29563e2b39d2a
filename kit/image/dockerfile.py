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

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from kit import files
from kit.image import ignore as ignores
from kit.image.recipe import SOURCE_LIMIT, Base, Recipe, context_path, pip_requirements
from kit.errors import KitError

# Accepted, with a one-line notice: they mean nothing to an enroot image.
IGNORED = ("EXPOSE", "HEALTHCHECK", "STOPSIGNAL", "ONBUILD", "MAINTAINER")
KNOWN = ("FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "LABEL", "ENTRYPOINT", "CMD", "VOLUME", "USER",
         "SHELL", "KIT", *IGNORED)
BASE_PREFIXES = {"rootfs:": "rootfs", "tarball:": "tarball", "oci:": "oci", "docker-archive:": "docker-archive",
                 "squashfs:": "squashfs"}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Instruction:
    line: int
    keyword: str
    text: str  # the arguments, continuation lines joined
    heredocs: list[tuple[str, str]] = field(default_factory=list)  # (delimiter, body)


@dataclass
class Stage:
    index: int
    name: str | None
    recipe: Recipe


def _error(label: str, line: int, message: str, hint: str | None = None) -> KitError:
    return KitError(message, field=f"{label}:{line}", hint=hint)


def parse(text: str, label: str) -> list[Instruction]:
    """Instructions of a Dockerfile, with their first line numbers."""
    lines = text.splitlines()
    escape = "\\"
    i = 0
    # Parser directives: comments at the very top, before anything else.
    while i < len(lines):
        m = re.fullmatch(r"#\s*([A-Za-z]+)\s*=\s*(\S*)\s*", lines[i])
        if not m:
            break
        key, value = m.group(1).lower(), m.group(2)
        if key == "escape":
            if value not in ("\\", "`"):
                raise _error(label, i + 1, f"escape must be \\ or `, got {value!r}")
            escape = value
        i += 1
    out: list[Instruction] = []
    while i < len(lines):
        raw = lines[i]
        start = i + 1
        i += 1
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        parts = [raw]
        while parts[-1].rstrip().endswith(escape):
            parts[-1] = parts[-1].rstrip()[:-1]
            # Comment lines and empty lines inside a continuation are dropped.
            while i < len(lines) and (lines[i].lstrip().startswith("#") or not lines[i].strip()):
                i += 1
            if i >= len(lines):
                break
            parts.append(lines[i])
            i += 1
        joined = " ".join(p.strip() for p in parts)
        keyword, _, rest = joined.partition(" ")
        keyword = keyword.upper()
        if keyword not in KNOWN:
            raise _error(label, start, f"unknown instruction {keyword}",
                         hint="kit builds from FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, LABEL, ENTRYPOINT, CMD, "
                              "VOLUME, USER, SHELL and its own KIT")
        heredocs = []
        for m in re.finditer(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2", rest):
            strip, delimiter = m.group(1) == "-", m.group(3)
            body = []
            while i < len(lines) and (lines[i].lstrip("\t") if strip else lines[i]) != delimiter:
                body.append(lines[i].lstrip("\t") if strip else lines[i])
                i += 1
            if i >= len(lines):
                raise _error(label, start, f"heredoc <<{delimiter} is not closed")
            i += 1
            heredocs.append((delimiter, "\n".join(body) + "\n"))
        out.append(Instruction(start, keyword, rest.strip(), heredocs))
    return out


def _substitute(text: str, env: dict[str, str], label: str, line: int) -> str:
    """$VAR, ${VAR}, ${VAR:-default} and ${VAR:+alternative} from ARG and ENV values; \\$ is a literal $."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and text[i + 1:i + 2] == "$":
            out.append("$")
            i += 2
            continue
        if c != "$":
            out.append(c)
            i += 1
            continue
        m = NAME.match(text, i + 1)
        if m:
            out.append(env.get(m.group(), ""))
            i = m.end()
            continue
        m = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:(:[-+])([^}]*))?\}").match(text, i + 1)
        if not m:
            if text[i + 1:i + 2] == "{":
                raise _error(label, line, f"unsupported substitution {text[i:i + 20]}...",
                             hint="use ${VAR}, ${VAR:-default} or ${VAR:+alternative}")
            out.append(c)
            i += 1
            continue
        value = env.get(m.group(1), "")
        if m.group(2) == ":-":
            value = value or m.group(3)
        elif m.group(2) == ":+":
            value = m.group(3) if value else ""
        out.append(value)
        i = m.end()
    return "".join(out)


def _words(text: str, label: str, line: int) -> list[str]:
    """Whitespace-split words, honouring double and single quotes."""
    try:
        return shlex.split(text, posix=True)
    except ValueError as e:
        raise _error(label, line, f"cannot split the arguments: {e}") from None


def _exec_form(text: str) -> list[str] | None:
    """A JSON array of strings, or None (the shell form)."""
    if not text.startswith("["):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def _flags(text: str, allowed: tuple[str, ...], label: str, line: int) -> tuple[dict[str, str], str]:
    flags = {}
    while text.startswith("--"):
        word, _, text = text.partition(" ")
        key, sep, value = word[2:].partition("=")
        if key not in allowed:
            raise _error(label, line, f"unsupported flag --{key}",
                         hint=("accepted here: " + ", ".join(f"--{a}" for a in allowed)) if allowed else None)
        if not sep:
            raise _error(label, line, f"--{key} needs a value (--{key}=VALUE)")
        flags[key] = value
        text = text.lstrip()
    return flags, text


def _pairs(text: str, label: str, line: int, what: str) -> dict[str, str]:
    """KEY=VALUE pairs (quotes allowed), or the legacy `KEY VALUE` form."""
    words = _words(text, label, line)
    if words and "=" not in words[0]:
        if len(words) < 2:
            raise _error(label, line, f"{what} needs KEY=VALUE")
        return {words[0]: text.split(None, 1)[1].strip().strip('"')}
    out = {}
    for w in words:
        key, sep, value = w.partition("=")
        if not sep or not key:
            raise _error(label, line, f"{what}: expected KEY=VALUE, got {w!r}")
        out[key] = value
    return out


class _Builder:
    """Turns a Dockerfile's instructions into one Recipe per stage."""

    def __init__(self, path: Path, label: str, build_args: dict[str, str], notice,
                 base_roots: tuple[Path, ...] = ()) -> None:
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
            return Base("stage", earlier.name or str(earlier.index)), {earlier.name or str(earlier.index): earlier.recipe}
        if ref == "scratch":
            return Base("scratch", ""), {}
        if ref.startswith("docker://"):
            return Base("image", ref), {}
        for prefix, kind in BASE_PREFIXES.items():
            if ref.startswith(prefix):
                # Inside the build context, as COPY sources, or under a directory named on the command
                # line (--base-root): a Dockerfile must not pack host files it was not given.
                value = ref[len(prefix):]
                for allowed in self.base_roots:
                    real = allowed.resolve()
                    path = (self.where / value).resolve()
                    if path == real or real in path.parents:
                        return Base(kind, str(path)), {}
                try:
                    path = context_path(self.where, value, f"{self.label}:{line}")
                except KitError as e:
                    raise KitError(e.message.replace("copy source", f"FROM {prefix}"), field=e.field,
                                   hint="put the base inside the build context (a symlink to elsewhere does not "
                                        "count), or name its directory with --base-root DIR") from None
                return Base(kind, str(path)), {}
        raise _error(self.label, line, f"FROM {ref}: not a base kit can build from",
                     hint="write FROM rootfs:DIR, tarball:FILE, oci:DIR, docker-archive:FILE, squashfs:FILE, "
                          "docker://IMAGE, scratch, or an earlier stage's name")

    def run(self, instructions: list[Instruction]) -> None:
        global_args: dict[str, str] = {}
        recipe: Recipe | None = None
        env: dict[str, str] = {}
        shell = ["/bin/sh", "-c"]
        workdir = "/"
        stage_args: dict[str, str] = {}
        env_keys: set[str] = set()
        for ins in instructions:
            where = (self.label, ins.line)
            if ins.keyword == "FROM":
                flags, rest = _flags(ins.text, (), *where)
                words = _substitute(rest, {**global_args}, *where).split()
                if len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS"):
                    raise _error(*where, "FROM takes BASE [AS NAME]")
                name = words[2].lower() if len(words) == 3 else None
                if name and self.stage(name):
                    raise _error(*where, f"a stage named {name!r} already exists")
                base, deps = self.base(words[0], ins.line)
                recipe = Recipe(path=self.path.resolve(), label=self.label, base=base, stages=dict(deps))
                self.stages.append(Stage(len(self.stages), name, recipe))
                env = {k: v for k, v in global_args.items()}
                stage_args: dict[str, str] = {}
                env_keys: set[str] = set()
                shell, workdir = ["/bin/sh", "-c"], "/"
                continue
            if ins.keyword == "ARG":
                for word in _words(ins.text, *where):
                    key, sep, default = word.partition("=")
                    if not NAME.fullmatch(key):
                        raise _error(*where, f"ARG: not a name: {key!r}")
                    self.used_args.add(key)
                    value = self.build_args.get(key, _substitute(default, env, *where) if sep else None)
                    target = global_args if recipe is None else env
                    if value is not None:
                        target[key] = value
                    elif key in global_args and recipe is not None:
                        env[key] = global_args[key]  # ARG NAME after FROM takes the global value
                    if recipe is not None and key in env:
                        stage_args[key] = env[key]
                continue
            if recipe is None:
                raise _error(*where, f"{ins.keyword} before the first FROM")
            if ins.keyword in IGNORED:
                self.notice(f"{self.label}:{ins.line}: {ins.keyword} means nothing to an enroot image: ignored")
                continue
            text = ins.text
            if ins.keyword == "RUN":
                flags, text = _flags(text, (), *where)
                argv = _exec_form(text)
                if ins.heredocs and re.fullmatch(r"(?:<<-?([\"']?)[A-Za-z_][A-Za-z0-9_]*\1\s*)+", text):
                    argv = [*shell, ins.heredocs[0][1]]  # `RUN <<EOF`: the body is the script
                elif ins.heredocs:
                    # `RUN cmd <<EOF`: the shell reads the body as cmd's stdin, as Docker runs it.
                    argv = [*shell, text + "\n" + "".join(f"{body}{delim}\n" for delim, body in ins.heredocs)]
                elif argv is None:
                    argv = [*shell, text]
                # Docker passes the stage's ARG values to RUN's environment (ENV wins over them);
                # they are part of the step, so of its cache key, and not kept in the image.
                args = {k: v for k, v in stage_args.items() if k not in env_keys}
                self.add(recipe, ins, ("run", {"argv": argv, "args": args} if args else argv))
            elif ins.keyword in ("COPY", "ADD"):
                flags, text = _flags(text, ("from", "chmod", "chown", "link") if ins.keyword == "COPY"
                                     else ("chmod", "chown", "link"), *where)
                text = _substitute(text, env, *where)
                args = _exec_form(text) or _words(text, *where)
                if len(args) < 2:
                    raise _error(*where, f"{ins.keyword} needs SRC... DEST")
                *sources, dest = args
                if not dest.startswith("/"):
                    dest = str(Path(workdir) / dest) + ("/" if dest.endswith("/") else "")
                if len(sources) > 1 and not dest.endswith("/"):
                    raise _error(*where, f"{ins.keyword} with several sources needs a DEST ending in /")
                chmod = flags.get("chmod")
                if chmod is not None and not re.fullmatch(r"[0-7]{3,4}", chmod):
                    raise _error(*where, f"--chmod takes an octal mode, got {chmod!r}")
                if "chown" in flags:
                    self.notice(f"{self.label}:{ins.line}: --chown: enroot images are packed with every file owned "
                                "by root (mksquashfs -all-root), and jobs run as the submitting user: ignored")
                for src in sources:
                    if ins.keyword == "ADD" and re.match(r"[a-z]+://", src):
                        raise _error(*where, f"ADD {src}: kit does not download while building (no network on "
                                             "the nodes that build)", hint="download it first and COPY the file")
                    if "from" in flags:
                        stage = self.stage(flags["from"])
                        if stage is None or stage.recipe is recipe:
                            raise _error(*where, f"COPY --from={flags['from']}: no earlier stage of that name",
                                         hint="name a stage with FROM ... AS NAME before this line")
                        key = stage.name or str(stage.index)
                        recipe.stages[key] = stage.recipe
                        value = {"stage": key, "src": src, "dst": dest}
                    else:
                        if any(c in src for c in "*?["):
                            raise _error(*where, f"{ins.keyword} {src}: wildcards are not supported",
                                         hint="name the files or their directory")
                        path = context_path(self.where, src, f"{self.label}:{ins.line}")
                        if self.ignore.skips(path.relative_to(self.where.resolve()).as_posix(), path.is_dir()):
                            raise _error(*where, f"{ins.keyword} {src}: excluded by .dockerignore")
                        value = {"src": str(path), "dst": dest, "ignore": self.ignore.patterns,
                                 "context": str(self.where.resolve()), "extract": ins.keyword == "ADD"}
                    if chmod is not None:
                        value["chmod"] = chmod
                    self.add(recipe, ins, ("add", value))
            elif ins.keyword == "ENV":
                pairs = {k: _substitute(v, env, *where) for k, v in _pairs(text, *where, "ENV").items()}
                for key in pairs:
                    if not NAME.fullmatch(key):
                        raise _error(*where, f"ENV: not a variable name: {key!r}")
                env.update(pairs)
                env_keys.update(pairs)
                self.add(recipe, ins, ("env", pairs))
            elif ins.keyword == "WORKDIR":
                value = _substitute(text, env, *where)
                workdir = value if value.startswith("/") else str(Path(workdir) / value)
                self.add(recipe, ins, ("workdir", workdir))
            elif ins.keyword == "LABEL":
                recipe.labels.update({k: _substitute(v, env, *where) for k, v in _pairs(text, *where, "LABEL").items()})
            elif ins.keyword in ("ENTRYPOINT", "CMD"):
                argv = _exec_form(text)
                words = argv if argv is not None else [*shell, text]
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
            elif ins.keyword == "VOLUME":
                vols = _exec_form(text) or _words(_substitute(text, env, *where), *where)
                recipe.volumes.extend(v for v in vols if v not in recipe.volumes)
            elif ins.keyword == "SHELL":
                argv = _exec_form(text)
                if not argv:
                    raise _error(*where, 'SHELL takes the exec form, e.g. SHELL ["/bin/bash", "-c"]')
                shell = argv
            elif ins.keyword == "KIT":
                # kit's own steps, which a Dockerfile has no words for (docker stops at them: unknown
                # instruction): `KIT pip REQ...` installs with the host's pip into the image's Python
                # (no network or pip needed in the image), `KIT runtime` adds kit's runtime at /opt/kit.
                words = _words(_substitute(text, env, *where), *where)
                if words[:1] == ["pip"] and len(words) > 1:
                    self.add(recipe, ins, ("pip", pip_requirements(words[1:], self.where, f"{self.label}:{ins.line}")))
                elif words == ["runtime"]:
                    self.add(recipe, ins, ("kit", True))
                else:
                    raise _error(*where, f"KIT {text}: expected `KIT pip REQUIREMENT...` or `KIT runtime`")
            elif ins.keyword == "USER":
                user = _substitute(text, env, *where)
                recipe.labels["kit.user"] = user
                self.notice(f"{self.label}:{ins.line}: USER {user}: enroot runs the container as the user who "
                            "submits the job, and kit runs RUN steps as root; recorded as the label kit.user")
        unused = sorted(set(self.build_args) - self.used_args)
        if unused:
            self.notice(f"--build-arg {', '.join(unused)}: no ARG of that name in {self.label}")


def load(path: str | Path, *, build_args: dict[str, str] | None = None, target: str | None = None,
         notice=lambda msg: None, base_roots: tuple[Path, ...] = ()) -> Recipe:
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
        raise KitError(f"line {text.count(chr(10), 0, text.index(chr(0))) + 1}: a NUL byte", field=label,
                       hint="a Dockerfile is text; no path, value or command can hold a NUL byte")
    builder = _Builder(p, label, build_args or {}, notice, tuple(Path(r) for r in base_roots))
    builder.run(parse(text, label))
    if not builder.stages:
        raise KitError("no FROM instruction", field=label, hint="a Dockerfile starts with FROM BASE")
    if target is None:
        return builder.stages[-1].recipe
    stage = builder.stage(target)
    if stage is None:
        names = [s.name for s in builder.stages if s.name]
        raise KitError(f"no stage named {target!r}", field="--target",
                       hint=("stages: " + ", ".join(names)) if names else "name stages with FROM ... AS NAME")
    return stage.recipe
