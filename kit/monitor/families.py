"""Samples and the one place they become prometheus-client metric families."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from prometheus_client.core import Metric


@dataclass(frozen=True)
class Spec:
    """A metric: its exposed name, Prometheus type and help text."""

    name: str
    type: str  # gauge, counter, unknown (rendered "untyped")
    help: str


@dataclass
class Sample:
    spec: Spec
    labels: dict
    value: float


@dataclass
class SourceResult:
    """What one poll of a source gave: its samples, whether it worked, how long it took."""

    samples: list[Sample] = field(default_factory=list)
    success: bool = False
    duration: float = 0.0
    error: str = ""


def families(samples: Iterable[Sample], names: dict | None = None, labels: dict | None = None) -> list[Metric]:
    """Group samples into families, renaming metrics and label names by
    ``names``/``labels`` (see kit.monitor.naming) and keeping every other name
    exactly as given.

    So dcgm-exporter's names (``DCGM_FI_DEV_...``) stay as they are; counters
    (whose names end in ``_total``) get their family named without it, as the
    text format wants.
    """
    names, labels = names or {}, labels or {}
    out: dict[str, Metric] = {}
    for s in samples:
        name = names.get(s.spec.name, s.spec.name)
        fam = out.get(name)
        if fam is None:
            # A counter family is named without its _total; the text format adds it back.
            family_name = name[: -len("_total")] if s.spec.type == "counter" else name
            fam = out[name] = Metric(family_name, s.spec.help, s.spec.type)
        fam.add_sample(name, {labels.get(k, k): str(v) for k, v in s.labels.items()}, float(s.value))
    return list(out.values())
