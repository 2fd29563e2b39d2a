"""Task sets: an index set (``0-9``, ``1,3,5``, ``0-99%8``) and parameter sweeps.

A sweep is named parameters with lists of values; their cartesian product, in
a fixed order (the first parameter varies slowest), makes one task per
combination. A task sees its values as ``{NAME}`` in the command's arguments
(``{{``/``}}`` for literal braces) and as ``KIT_SWEEP_<NAME>`` variables.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from kit.errors import KitError

# Slurm's default MaxArraySize is 1001: indices 0-1000.
MAX_INDEX = 1000
MAX_TASKS = 1001
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class TaskSet:
    indices: tuple[int, ...]
    throttle: int | None = None  # at most this many at once

    def render(self) -> str:
        """The index set in the scheduler's array syntax (ranges folded)."""
        parts, run = [], []
        for i in self.indices:
            if run and i == run[-1] + 1:
                run.append(i)
                continue
            if run:
                parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = [i]
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        return ",".join(parts) + (f"%{self.throttle}" if self.throttle else "")


def parse_tasks(text: str, label: str, count: int | None = None) -> TaskSet:
    """``A``, ``A-B``, ``A-B:STEP``, comma-separated, optional ``%K``. With a
    sweep of ``count`` tasks the text may be ``%K`` alone (all of them, K at once)."""
    body, _, throttle_text = text.strip().partition("%")
    throttle = None
    if throttle_text:
        if not throttle_text.isdigit() or int(throttle_text) < 1:
            raise KitError(f"the throttle after % must be a whole number of at least 1, got {text!r}", field=label)
        throttle = int(throttle_text)
    if not body and count is not None:
        return TaskSet(tuple(range(count)), throttle)
    indices: set[int] = set()
    for item in body.split(","):
        m = re.fullmatch(r"(\d{1,7})(?:-(\d{1,7})(?::(\d{1,7}))?)?", item.strip())
        if not m:
            raise KitError(
                f"not an index set: {text!r}", field=label, hint="e.g. 0-9, 1,3,5, 0-99%8 (at most 8 at once), 0-20:5"
            )
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) is not None else low
        step = int(m.group(3)) if m.group(3) is not None else 1
        if high < low or step < 1:
            raise KitError(f"empty range {item!r} in {text!r}", field=label)
        indices.update(range(low, high + 1, step))
    if max(indices) > MAX_INDEX:
        raise KitError(
            f"index {max(indices)} is above {MAX_INDEX} (Slurm's default MaxArraySize is {MAX_INDEX + 1})", field=label
        )
    if count is not None and max(indices) >= count:
        raise KitError(
            f"the sweep has {count} task(s), 0-{count - 1}; {text!r} names {max(indices)}",
            field=label,
            hint="leave --array out, or give only the throttle: --array %2",
        )
    return TaskSet(tuple(sorted(indices)), throttle)


def parse_sweep_item(text: str, label: str) -> tuple[str, list[str]]:
    """``NAME=V1,V2,...`` from the command line."""
    name, sep, values = text.partition("=")
    if not sep:
        raise KitError(f"expected NAME=V1,V2,..., got {text!r}", field=label, hint="e.g. --sweep lr=0.1,0.01")
    return check_sweep(name, values.split(","), label)


def check_sweep(name: str, values: list, label: str) -> tuple[str, list[str]]:
    if not NAME.fullmatch(name):
        raise KitError(
            f"not a parameter name: {name!r}",
            field=label,
            hint="letters, digits and _, not starting with a digit (it becomes KIT_SWEEP_NAME)",
        )
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise KitError(f"{name}: values are strings or numbers, got {v!r}", field=label)
        out.append(v if isinstance(v, str) else repr(v))
    if not out:
        raise KitError(f"{name}: no values", field=label)
    if any("\x00" in v for v in out):
        raise KitError(f"{name}: a value contains a NUL byte", field=label)
    if len(set(out)) != len(out):
        raise KitError(f"{name}: a value is given twice", field=label)
    return name, out


def combinations(sweep: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination, the first parameter varying slowest."""
    names = list(sweep)
    total = 1
    for values in sweep.values():
        total *= len(values)
    if total > MAX_TASKS:
        raise KitError(f"the sweep makes {total} tasks; at most {MAX_TASKS}", field="--sweep")
    return [dict(zip(names, combo)) for combo in itertools.product(*(sweep[n] for n in names))]


_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


def substitute(word: str, params: dict[str, str], label: str = "command") -> str:
    """``{NAME}`` -> its value; ``{{``/``}}`` -> a literal brace."""

    def one(m: re.Match) -> str:
        text = m.group(0)
        if text in ("{{", "}}"):
            return text[0]
        name = m.group(1)
        if name is None:
            raise KitError(
                f"a lone {text!r} in {word!r}", field=label, hint="with --sweep, write a literal brace as {{ or }}"
            )
        if name not in params:
            raise KitError(
                f"{{{name}}} in {word!r} is not a sweep parameter",
                field=label,
                hint="parameters: " + ", ".join(params) + "; write a literal brace as {{ or }}",
            )
        return params[name]

    return _PLACEHOLDER.sub(one, word)
