"""An existing sbatch script as a kit job file (`kit convert`).

What carries over: the ``#SBATCH`` options kit has fields for, other sbatch options as
``sbatch_args``, plain ``export NAME=value`` lines as ``env``, the training command (the last
``srun`` step that is not ``--overlap``, else the last command) with the variables it uses or
the script exports. What changes on the way (a mount's relative path, python as python3, a line run
under ``bash -c``) and the rest are listed, with why, never dropped silently."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field

from kit.core import spec as specs
from kit.core.text import printable
from kit.errors import KitError
from kit.slurm import convert_container, convert_launcher, shellwords
from kit.slurm.sbatch_words import (
    CONTAINER_FIELDS,
    FIELDS,
    INT_FIELDS,
    KIT_SETS,
    RENDEZVOUS,
    SETUP_WORDS,
    leading_options,
    option,
)


@dataclass
class Converted:
    fields: dict = field(default_factory=dict)
    not_carried: list[str] = field(default_factory=list)  # "WHAT: why"
    changed: list[str] = field(default_factory=list)  # carried, but not as it was: "WHAT: how"

    def toml(self, source: str) -> str:
        lines = [f"# kit job file, from {printable(source)} by kit convert (kit launch -f THIS_FILE)"]
        for name, value in self.fields.items():
            lines.append(f"{name} = {_toml(value)}")
        for title, items in (("Carried over, changed:", self.changed), ("Not carried over:", self.not_carried)):
            if items:
                lines += ["", f"# {title}"] + [f"#   {printable(item)}" for item in items]
        return "\n".join(lines) + "\n"


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    text = str(value)
    return (
        '"'
        + "".join(
            c if c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
            for c in text
        )
        + '"'
    )


def _sbatch_option(c: Converted, name: str, value: str | None, origin: str = "#SBATCH") -> None:
    where = f"{origin} {name}" + (f"={value}" if value is not None else "")
    if name in CONTAINER_FIELDS:
        key, kind = CONTAINER_FIELDS[name]
        if isinstance(kind, bool):
            c.fields[key] = kind
        elif value is not None:
            c.fields[key] = [v for v in value.split(",") if v] if kind == "list" else value
        if key == "mounts":
            c.changed.append(
                f"{where}: carried as mounts; the job starts in its code view (a copy of the "
                "work tree at submission, under the job directory), where a relative path such "
                "as data/ is the work tree's own (linked when the snapshot leaves it out), not "
                "a mount's: give the command the mount's absolute path"
            )
        return
    if name in FIELDS and value is not None:
        key = FIELDS[name]
        if key in INT_FIELDS:
            if not value.isdigit():
                c.not_carried.append(f"{where}: kit's {key} is one number")
                return
            c.fields[key] = int(value)
        else:
            c.fields[key] = value
        if key == "image":
            c.changed.append(
                f"{where}: carried as image: kit puts it on the srun step (on the batch script, "
                "pyxis would run the script itself in the image, where srun does not exist)"
            )
        return
    if name == "--gres" and value:
        m = re.fullmatch(r"gpu(?::[A-Za-z0-9_.-]+)?:(\d+)", value)
        if m:
            c.fields["gpus_per_node"] = int(m.group(1))
            return
    if name in ("--output", "-o", "--error", "-e"):
        c.not_carried.append(f"{where}: kit writes the logs into the job directory (logs/; kit logs JOB)")
        return
    if name in ("--requeue", "--no-requeue"):
        c.not_carried.append(f"{where}: kit requeues by itself, within --max-restarts")
        return
    if name == "--signal" and value:
        m = re.fullmatch(r"(?:B:)?(?:SIG)?([A-Z0-9]+)(?:@(\d+))?", value)
        if m:
            c.fields["signal"] = m.group(1)
            if m.group(2):
                c.fields["signal_lead"] = int(m.group(2))
            return
    if name in ("--dependency", "-d") and value:
        kinds = {"afterok": "ok", "afterany": "any", "afternotok": "notok"}
        kind, _, ids = value.partition(":")
        if kind in kinds and all(i.isdigit() for i in ids.split(":")):
            c.fields["after"] = [f"{i}:{kinds[kind]}" for i in ids.split(":")]
            return
    arg = (
        f"{name}={value}"
        if value is not None and name.startswith("--")
        else (f"{name}{value}" if value is not None else name)
    )
    if specs.owned_sbatch_option(arg):
        c.not_carried.append(f"{where}: kit sets it itself ({specs.OWNED_SBATCH[specs.owned_sbatch_option(arg)]})")
        return
    c.fields.setdefault("sbatch_args", []).append(arg)


def _command(c: Converted, words: list[str], line: str) -> None:
    """The training command (srun's options dropped, torchrun's rendezvous options too). A line
    with shell syntax (pipes, ``&&``, ``;``, redirections, ``$(...)``, backticks) runs its text,
    as written after srun's options, under ``bash -c``: re-quoting its words would change it."""
    skip = 0
    if words and words[0] == "srun":
        dropped, i = leading_options(words)
        if dropped:
            c.not_carried.append(f"srun {' '.join(dropped)}: kit runs its own srun from the job's fields")
        words, skip = words[i:], i
    if not words:
        return
    syntax = shellwords.shell_syntax(line)
    if syntax:
        text = shellwords.after_words(line.strip(), skip)
        c.fields["command"] = ["bash", "-c", text]
        c.changed.append(
            f"{line.strip()}: it uses shell syntax ({syntax}): its text runs under bash -c as "
            "written (kit passes arguments without a shell)"
        )
        return
    spans = shellwords.spans(line.strip())
    raw = [line.strip()[a:b] for a, b in spans][skip:] if len(spans) == len(words) + skip else None
    launcher = words[0].rsplit("/", 1)[-1]
    is_torchrun = launcher == "torchrun" or (
        len(words) > 2 and words[1] == "-m" and words[2] in ("torch.distributed.run", "torch.distributed.launch")
    )
    if is_torchrun:
        kept, i = [], 0
        while i < len(words):
            name = words[i].split("=", 1)[0]
            if name in RENDEZVOUS:
                step = 1 if "=" in words[i] or i + 1 >= len(words) else 2
                c.not_carried.append(
                    f"{' '.join(words[i : i + step])}: kit exports PET_NNODES, PET_NODE_RANK, "
                    "PET_MASTER_ADDR and PET_MASTER_PORT for torchrun"
                )
                i += step
                continue
            kept.append(i)
            i += 1
        words, raw = [words[k] for k in kept], ([raw[k] for k in kept] if raw else None)
        c.fields.setdefault("ntasks_per_node", 1)
    if any("$" in w for w in words):  # the words as written: their quotes decide how $VARS expand
        c.fields["command"] = ["bash", "-c", " ".join(raw) if raw else shellwords.shell_words(words)]
        c.changed.append(
            f"{line.strip()}: it holds $VARIABLES, so it runs under bash -c (kit passes arguments without a shell)"
        )
    else:
        c.fields["command"] = words


def convert(
    text: str, sbatch_args: list[str] | tuple[str, ...] = (), inspect=None, cwd: str | None = None, read=None
) -> Converted:
    """The job-file fields of the sbatch script ``text`` submitted with ``sbatch_args`` (the options its
    user puts on sbatch's command line: they win over its #SBATCH lines, as in sbatch), and what did not
    carry over. ``inspect(image, paths)``: which of ``paths`` an image file has (``python`` runs as
    ``python3`` in an image with python3 alone); ``cwd``: where the job will be submitted from; ``read(path)``:
    a file's text (the script a file's ``sbatch`` line submits, a launcher the step runs)."""
    line = submission(text)
    if line is not None:
        return _submitted(line, sbatch_args, inspect, cwd, read)
    c = Converted()
    _script(c, text)
    i, words = 0, list(sbatch_args)
    while i < len(words):
        if not words[i].startswith("-"):
            c.not_carried.append(
                f"sbatch {' '.join(words[i:])}: not an option (the script is kit convert's first "
                "argument; what follows -- is sbatch's options)"
            )
            break
        name, value, i = option(words, i)
        _sbatch_option(c, name, value, origin="sbatch")
    if read is not None:
        convert_launcher.inline(c.fields, c.changed, cwd, read)
    if inspect is not None:
        convert_container.python3(c.fields, c.changed, inspect)
    convert_container.submission_paths(c.fields, c.changed, cwd)
    return c


def submission(text: str) -> list[str] | None:
    """The words of the file's ``sbatch`` command line, when it holds one (a file of how a job is submitted)."""
    found = []
    for line in shellwords.logical_lines(text):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        while words and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words = words[1:]  # NAME=value sbatch ...
        if words and words[0] == "sbatch":
            found.append([os.path.expandvars(w) for w in words])  # as the shell that runs the line expands it
    if len(found) > 1:
        raise KitError(
            f"the file runs sbatch {len(found)} times: kit convert takes one job",
            field="SCRIPT",
            hint="convert the batch script itself: kit convert SCRIPT -- SBATCH-OPTIONS",
        )
    return found[0] if found else None


def _submitted(words: list[str], sbatch_args, inspect, cwd: str | None, read) -> Converted:
    """A file holding ``sbatch OPTIONS SCRIPT``: the script it submits, converted with those options."""
    options, i = leading_options(words)
    hint = "convert the batch script itself, with sbatch's options after --: kit convert SCRIPT -- SBATCH-OPTIONS"
    if i >= len(words) or read is None or any(o.startswith("--wrap") for o in options):
        raise KitError("the file runs sbatch without a batch script kit convert can read", field="SCRIPT", hint=hint)
    script = words[i]
    try:
        text = read(os.path.join(cwd or ".", script))
    except OSError as e:
        raise KitError(
            f"the file runs sbatch on {script}, which cannot be read: {e.strerror or e}", field="SCRIPT", hint=hint
        ) from None
    c = convert(text, [*options, *sbatch_args], inspect, cwd, read)
    c.changed.insert(0, f"sbatch … {script}: the file submits {script}: converted with that line's options")
    if words[i + 1 :]:
        c.not_carried.append(f"{shlex.join(words[i + 1 :])}: the batch script's arguments (put them in the command)")
    return c


def _script(c: Converted, text: str) -> None:
    """The fields of the script's #SBATCH lines and commands into ``c``."""
    commands: list[tuple[list[str], str]] = []
    assigned: list[tuple[str, str, int]] = []  # NAME=value lines: (name, text, commands before it)
    for line in shellwords.logical_lines(text):
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            try:
                words = shlex.split(stripped[len("#SBATCH") :], comments=True)
            except ValueError:
                c.not_carried.append(f"{stripped}: not readable")
                continue
            i, options = 0, []
            while i < len(words) and words[i].startswith("-"):
                name, value, i = option(words, i)
                options.append((name, value))
            if i < len(words):  # nothing of such a line is carried: what sbatch makes of it is unclear
                c.not_carried.append(
                    f"{stripped}: {words[i]!r} is not an option (sbatch runs no shell over "
                    "#SBATCH lines: $(...) there stays literal text)"
                )
                continue
            for name, value in options:
                _sbatch_option(c, name, value)
            continue
        if not stripped or stripped.startswith("#"):
            continue
        computed = "$(" in stripped or "`" in stripped
        if stripped.startswith("export ") and computed:
            items = [stripped[len("export ") :].strip()]  # one NAME=$(...) (shlex would split the command)
        elif re.match(r"[A-Za-z_][A-Za-z0-9_]*=", stripped):
            name = stripped.split("=", 1)[0]
            if name in KIT_SETS:
                c.not_carried.append(f"{stripped}: kit sets {name} for every task")
            else:
                assigned.append((name, stripped, len(commands)))
            continue
        elif stripped.startswith("trap "):
            c.not_carried.append(
                f"{stripped}: kit passes the warning signal (--signal) to the command; a handler "
                "belongs in the command (see docs/endings.md: the preemption plan)"
            )
            continue
        else:
            items = None
        try:
            words = ["export", *items] if items else shlex.split(stripped, comments=True)
        except ValueError:
            c.not_carried.append(f"{stripped}: not readable")
            continue
        if words and words[0] == "exec":  # `exec srun ...`: the batch script becomes that step
            words = words[1:]
            stripped = shellwords.after_words(stripped, 1)
        if not words:
            continue
        if words[0] == "export" and len(words) >= 2:
            for item in words[1:]:
                name, eq, value = item.partition("=")
                if name in KIT_SETS:
                    c.not_carried.append(f"export {item}: kit sets {name} for every task")
                elif eq and "$" not in value and "`" not in value and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                    c.fields.setdefault("env", {})[name] = value
                elif eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                    text = f"export {item}" if items else f"export {name}={shellwords.double_quoted(value)}"
                    assigned.append((name, text, len(commands)))
                else:
                    c.not_carried.append(f"export {item}: not a variable kit can carry")
            continue
        if words[0] in SETUP_WORDS or "=" in words[0].split("/")[0]:
            c.not_carried.append(
                f"{stripped}: setup the job itself does not need (put it in the image, "
                "or in a wrapper script the command runs)"
            )
            continue
        commands.append((words, stripped))
    _choose(c, commands, assigned)


def _choose(c: Converted, commands: list[tuple[list[str], str]], assigned: list[tuple[str, str, int]]) -> None:
    """The training command among the script's commands, and the assignments it needs."""
    sruns = [(w, s) for w, s in commands if w[0] == "srun"]
    # An --overlap step shares the job's resources with another (a monitor, an interactive shell):
    # the training step is the last srun that is not one.
    main = [(w, s) for w, s in sruns if "--overlap" not in leading_options(w)[0]]
    chosen = (main or sruns or commands)[-1:] if commands else []
    for words, stripped in commands:
        if (words, stripped) not in chosen:
            c.not_carried.append(f"{stripped}: only the training command is carried over")
    if chosen:
        _command(c, *chosen[0])
        _carry_assignments(c, [a for a in assigned if a[2] <= commands.index(chosen[0])])
    else:
        c.not_carried.append("no command found: add command = [...]")


def _carry_assignments(c: Converted, assigned: list[tuple[str, str, int]]) -> None:
    """The script's variable assignments the command uses (``$NAME``, every exported one — the
    command's own programs read those — and what those use in turn), as lines before it in its
    ``bash -c`` text, in the script's order: a command that uses a variable the job file drops
    would fail. The rest are listed as not carried."""
    command = c.fields.get("command") or []
    used: set[str] = set()
    for _, text, _ in (a for a in assigned if "$!" in a[1]):
        c.not_carried.append(
            f"{text}: the pid of a background process kit does not start (kit records and tears down its own sidecars)"
        )
    assigned = [a for a in assigned if "$!" not in a[1]]
    if any(text.startswith("export ") for _, text, _ in assigned) and command[:2] != ["bash", "-c"]:
        c.fields["command"] = command = ["bash", "-c", shellwords.shell_words(command)]
    if command[:2] == ["bash", "-c"]:
        wanted = shellwords.names(command[2]) | {name for name, text, _ in assigned if text.startswith("export ")}
        for name, text, _ in reversed(assigned):
            if name in wanted and name not in used:
                used.add(name)
                wanted |= shellwords.names(text.split("=", 1)[1])
    carried = [text for name, text, _ in assigned if name in used]
    for name, text, _ in assigned:
        if name not in used:
            c.not_carried.append(f"{text}: a shell variable the command does not use (kit's --env takes values)")
    if carried:
        c.fields["command"] = ["bash", "-c", "\n".join([*carried, command[2]])]
        c.changed.append(f"{', '.join(sorted(used))}: set by the script, carried into the command's bash -c text")
    computed = sorted(name for name, text, _ in assigned if name in used and ("$(" in text or "`" in text))
    if computed:
        c.changed.append(
            f"{', '.join(computed)}: carried, but their $(...) now runs in every task, not once in the "
            "batch script: a value that differs from run to run (a random seed) would differ between "
            "ranks; compute it once and pass it with --env"
        )
