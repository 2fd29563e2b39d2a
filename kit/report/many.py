"""A report on many nodes: past ``MANY`` nodes, GPUs or ranks, the text gives each
measure's spread (min / median / max) and names its extreme nodes, the notes group what they
say of many nodes into one line, and the pictures draw a band (min to max, the median as a
line) with the outlying nodes drawn alone. ``report.json`` keeps every node all the same."""

from __future__ import annotations

import statistics
from collections import defaultdict

MANY = 8  # up to this many nodes, GPUs or curves, each is shown by itself
NAMED = 3  # extreme nodes named beside a spread, outliers drawn alone in a band's panel
OUTLIER = 0.2  # a curve whose mean is this far (a share of the median's) from the median's is drawn alone
NAMED_BEYOND = 0.1  # a node is named beside a spread when this far (a share of the median) from the median


def spread(label: str, values: dict[str, float], unit: str = "", low_first: bool = True, fmt: str = "{:.1f}") -> str:
    """``label: min X / median Y / max Z`` over ``values`` (name -> value), and the most extreme
    names (the lowest with ``low_first``, else the highest) that stand out from the median."""
    if not values:
        return f"{label}: -"
    ordered = sorted(values.items(), key=lambda kv: kv[1], reverse=not low_first)
    nums = [v for _, v in ordered]
    middle = statistics.median(nums)

    def show(v: float) -> str:
        return fmt.format(v) + unit

    far = [f"{name} {show(v)}" for name, v in ordered[:NAMED] if abs(v - middle) > NAMED_BEYOND * abs(middle)]
    word = "lowest" if low_first else "highest"
    return f"{label}: min {show(min(nums))} / median {show(middle)} / max {show(max(nums))} over {len(nums)}" + (
        f" ({word}: {', '.join(far)})" if far else ""
    )


def grouped(notes: list, make) -> list:
    """Notes of one kind about more than ``NAMED`` subjects as one note naming the first ones.
    A note is (level, kind, subject, text): ``kind`` is what the grouped note says of its
    subjects; ``make(level, text)`` builds the note kept."""
    kinds: dict[tuple[str, str], list] = defaultdict(list)
    for level, kind, subject, text in notes:
        kinds[(level, kind)].append((subject, text))
    out = []
    for level, kind, subject, text in notes:
        same = kinds[(level, kind)] if kind else [(subject, text)]
        if len(same) <= NAMED:
            out.append(make(level, text))
        elif (subject, text) == same[0]:
            more = len(same) - 2 * NAMED
            names = ", ".join(s for s, _ in same[: 2 * NAMED]) + (f" and {more} more" if more > 0 else "")
            out.append(make(level, f"{len(same)} {kind}: {names}"))
    return out


def banded(curves: list) -> list:
    """``curves`` ((label, points, style)) as they are when few; else, per style, the outlying
    curves alone and one band (min / median / max at each time) over the others."""
    if len(curves) <= MANY:
        return curves
    styles: dict[str, list] = defaultdict(list)
    for curve in curves:
        styles[repr(sorted(curve[2].items()))].append(curve)
    out = []
    for same in styles.values():
        if len(same) <= NAMED:
            out += same
            continue
        means = {i: statistics.fmean(v for _, v in pts) for i, (_, pts, _) in enumerate(same) if pts}
        middle = statistics.median(means.values()) if means else 0.0
        far = sorted(
            (i for i, m in means.items() if abs(m - middle) > OUTLIER * abs(middle)),
            key=lambda i: -abs(means[i] - middle),
        )[:NAMED]
        rest = [pts for i, (_, pts, _) in enumerate(same) if i not in far]  # the band: the nodes alike
        out.append((f"{len(rest)} {_noun(same[0][0])}: median, min to max", *_band(rest, same[0][2])))
        out += [same[i] for i in far]
    return out


def _noun(label: str) -> str:
    """What a band's curves are, from one curve's label ("node7 job" -> "nodes, job")."""
    first, _, rest = label.partition(" ")
    if first == "rank":
        return "ranks"
    if rest.startswith("gpu"):
        return "GPUs"
    return f"nodes, {rest}" if rest else "nodes"


def _band(curves: list, style: dict) -> tuple[list, dict]:
    """The median line and its band over the curves, at the polls' times (to the second)."""
    at: dict[float, list[float]] = defaultdict(list)
    for pts in curves:
        for t, v in pts:
            at[round(t)].append(v)
    times = sorted(at)
    median = [(t, statistics.median(at[t])) for t in times]
    return median, {**style, "band": [(t, min(at[t]), max(at[t])) for t in times]}
