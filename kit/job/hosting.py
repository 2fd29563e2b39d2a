"""A :class:`kit.Job`'s methods on a login node: one registry, read on both sides of the transport.

A method marked :func:`hosted` runs its body for a job here. For a job on a login node (``job.there``: the
transport :mod:`kit.api` hands it, a :class:`There`), its name and arguments travel instead: kit there looks
the name up in :data:`CALLS` (:func:`serve`), runs the same method on the same job there and encodes its value
(``encode``, JSON as it is by default), and here it is decoded back (``decode``). A method whose login-node side
is more than one value (callbacks fed there) names that side (``serve``); one whose laptop side is more than one
call (a picture written here, a wait ridden through) names that (``laptop``), written with the transport's calls
alone. A method is written once; over ``host=`` it is callable by being here. kit/job knows no transport:
:class:`There` is the seam kit.remote fills.
"""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Protocol


class There(Protocol):
    """The transport to a login node, as a job's hosted methods use it (:class:`kit.remote.there.There`)."""

    name: str  # the login node, as the user named it

    def call(self, name: str, job: dict | None, args: dict) -> Any:
        """``name`` (a :data:`CALLS` entry) with ``args`` made there, of the job at ``job`` (its ``dir``, ``id``;
        ``output_dir``: where an id is looked up) or of none: its value (JSON), or its KitError here."""

    def riding(self, attempt: Callable[[], Any], note: Callable[[], None]) -> Any:
        """``attempt()``, made again while the connection is down (``note()`` told before each new one)."""

    def follow(self, job_dir: str, write: Callable[[bytes], Any]) -> None:
        """`kit logs -f` of the job there, its bytes to ``write`` as they come."""


def _same(value: Any) -> Any:
    return value


def _kept(job: Any, value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Hosted:
    """One call a laptop may make of a job on a login node (see the module's text)."""

    name: str
    method: Callable
    encode: Callable[[Any], Any] = _same
    decode: Callable[[Any, Any], Any] = _kept
    serve: Callable[[Any, dict], Any] | None = None  # (job there, args) -> the value to send
    laptop: Callable | None = None  # the method as the laptop runs it

    def owner(self) -> type | None:
        """The class the method is defined in (None: a function of no job)."""
        head, _, rest = self.method.__qualname__.partition(".")
        return getattr(sys.modules[self.method.__module__], head) if rest else None


CALLS: dict[str, Hosted] = {}


def register(entry: Hosted) -> None:
    """``entry`` in :data:`CALLS`; a second entry of one name is refused (a call would mean two things)."""
    if entry.name in CALLS and CALLS[entry.name].method is not entry.method:
        raise ValueError(f"a hosted call named {entry.name!r} is registered already")
    CALLS[entry.name] = entry


def hosted(*, name: str | None = None, encode=_same, decode=_kept, serve=None, laptop=None):
    """A :class:`kit.Job` method, callable for a job on a login node by being in :data:`CALLS` (as ``name``:
    the method's own by default)."""

    def mark(method: Callable) -> Callable:
        entry = Hosted(name or method.__name__, method, encode, decode, serve, laptop)
        register(entry)
        signature = inspect.signature(method)

        @functools.wraps(method)
        def call(self, *args, **kwargs):
            if self.there is None:
                return method(self, *args, **kwargs)
            if laptop is not None:
                return laptop(self, *args, **kwargs)
            return decode(self, self.there.call(entry.name, self._address(), sent(signature, self, args, kwargs)))

        return call

    return mark


def sent(signature: inspect.Signature, job: Any, args: tuple, kwargs: dict) -> dict:
    """A call's arguments by name, as they travel (paths as strings)."""
    bound = signature.bind(job, *args, **kwargs)
    bound.apply_defaults()
    out = dict(bound.arguments)
    out.pop(next(iter(signature.parameters)))  # the job itself travels as its directory and id
    return {k: str(v) if isinstance(v, Path) else v for k, v in out.items()}


def serve(name: str, job: Any, args: dict) -> Any:
    """On the login node: the call ``name`` on ``job`` (None for a call of no job), its value encoded. A name
    not in :data:`CALLS` is a KeyError."""
    entry = CALLS[name]
    owner = entry.owner()
    if owner is not None and not isinstance(job, owner):  # a function job's call: opened as one
        job = owner(job.dir, job_id=job.id)
    if entry.serve is not None:
        return entry.serve(job, args)
    return entry.encode(_apply(entry.method, [job] if owner is not None else [], args))


def _apply(method: Callable, first: list, args: dict) -> Any:
    """``method(*first, **args)``, a variadic parameter's value spread as Python would have taken it."""
    positional, named = list(first), {}
    for p in list(inspect.signature(method).parameters.values())[len(first) :]:
        if p.name not in args:
            continue
        if p.kind is p.VAR_POSITIONAL:
            positional += list(args[p.name] or ())
        elif p.kind is p.VAR_KEYWORD:
            named.update(args[p.name] or {})
        else:
            named[p.name] = args[p.name]
    return method(*positional, **named)


def data(cls: type) -> dict:
    """``encode``/``decode`` of a dataclass value (or None)."""
    return {
        "encode": lambda v: None if v is None else asdict(v),
        "decode": lambda job, v: None if v is None else cls(**v),
    }


def data_list(cls: type) -> dict:
    """``encode``/``decode`` of a list of dataclass values."""
    return {"encode": lambda vs: [asdict(v) for v in vs], "decode": lambda job, vs: [cls(**v) for v in vs]}
