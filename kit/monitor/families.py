"""Samples, the one place they become metric families, and the families' Prometheus text format (0.0.4).

The format is written here rather than by prometheus_client: importing that package costs the exporter 55 ms of
CPU at every node's start (its HTTP, WSGI and SSL modules come with it), over a third of the exporter's start; a
64-node job on one machine's cores waited on it. promtool and a real Prometheus check what is served (the tests).
"""

from __future__ import annotations

import math
from typing import Iterable, NamedTuple

# Named tuples, not dataclasses: the dataclasses module brings inspect, ast and dis, 4 ms of every exporter's start.


class Spec(NamedTuple):
    """A metric: its exposed name, Prometheus type and help text."""

    name: str
    type: str  # gauge, counter, unknown (rendered "untyped")
    help: str


class Sample(NamedTuple):
    spec: Spec
    labels: dict
    value: float


class SourceResult(NamedTuple):
    """What one poll of a source gave: its samples, whether it worked, how long it took."""

    samples: list[Sample] | tuple = ()
    success: bool = False
    duration: float = 0.0
    error: str = ""


class Family(NamedTuple):
    """A metric family: its name (a counter's without ``_total``), help, type and samples (name, labels, value)."""

    name: str
    help: str
    type: str
    samples: list[tuple[str, dict, float]]


def families(samples: Iterable[Sample], names: dict | None = None, labels: dict | None = None) -> list[Family]:
    """Group samples into families, renaming metrics and label names by
    ``names``/``labels`` (see kit.monitor.naming) and keeping every other name
    exactly as given.

    So dcgm-exporter's names (``DCGM_FI_DEV_...``) stay as they are; counters
    (whose names end in ``_total``) get their family named without it, as the
    text format wants.
    """
    names, labels = names or {}, labels or {}
    out: dict[str, Family] = {}
    for s in samples:
        name = names.get(s.spec.name, s.spec.name)
        fam = out.get(name)
        if fam is None:
            # A counter family is named without its _total; the text format adds it back.
            family_name = name[: -len("_total")] if s.spec.type == "counter" else name
            fam = out[name] = Family(family_name, s.spec.help, s.spec.type, [])
        fam.samples.append((name, {labels.get(k, k): str(v) for k, v in s.labels.items()}, float(s.value)))
    return list(out.values())


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def text(fams: Iterable[Family]) -> bytes:
    """The families in Prometheus's text format, version 0.0.4 (as prometheus_client's ``generate_latest``)."""
    lines = []
    for fam in fams:
        kind = "untyped" if fam.type == "unknown" else fam.type
        head = f"{fam.name}_total" if fam.type == "counter" else fam.name  # the samples' name, in this format
        lines += [f"# HELP {head} {_escape(fam.help, quote=False)}", f"# TYPE {head} {kind}"]
        for name, labels, value in fam.samples:
            inside = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{inside}}} {number(value)}" if inside else f"{name} {number(value)}")
    return ("\n".join(lines) + "\n").encode() if lines else b""


def number(value: float) -> str:
    """A sample value as Prometheus reads it (Go's spelling of infinities and NaN)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(value: str, quote: bool = True) -> str:
    value = value.replace("\\", "\\\\").replace("\n", "\\n")
    return value.replace('"', '\\"') if quote else value
