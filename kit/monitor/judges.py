"""Naming a straggler, in the room that runs it (the exporter's poll collects; a judge decides): the judge of the ranks' waits in the step's collectives (kit.train.stragglers measures).

Each rank's metrics file (``metrics/<node>/rank-<R>.json``) carries, over its last write interval, its mean step
time and its mean wait per step in the collectives (the gradient all-reduce and the step's others). A rank's
compute per step is the first less the second: a slow rank computes longer and waits for no one, the others wait
for it. A rank is named when its compute stays at least
:data:`SLOWER` times the other ranks' median (and :data:`AT_LEAST` seconds more) for :data:`SUSTAINED` seconds
(a checkpoint save on rank 0, a moment's noise do not name anyone). Two judges see what the ranks' steps do not:
:class:`GpuJudge` a GPU held down (NVML), :class:`LinkJudge` a node's slow network links (the round trips of the
job's busy TCP connections, kit.monitor.round_trips). The first node's exporter judges every few seconds, in its
poll (kit.monitor.training), and keeps the verdicts (kit.jobdir.slow_ranks), which every surface reads back.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Callable

from kit.jobdir.metrics import newest_rank_metrics
from kit.jobdir.slow_ranks import Straggler

SLOWER = 1.25  # compute per step this many times the other ranks' median ...
AT_LEAST = 0.02  # ... and this many seconds more: a slowdown worth a verdict
SUSTAINED = 20.0  # seconds a rank stays the outlier before it is named ...
MISSES = 0.25  # ... seen level with the others in at most this share of the judgements meanwhile
FRESH = 30.0  # a rank file this much older than the newest is another run's


def latest(job_dir: str | Path) -> dict[int, tuple[str, dict]]:
    """Each rank's node and newest metrics values, of the current run (within :data:`FRESH` of the newest)."""
    newest = newest_rank_metrics(job_dir)
    top = max((v["last_step_timestamp_seconds"] for _, v in newest.values()), default=0.0)
    return {r: (n, v) for r, (n, v) in newest.items() if top - v["last_step_timestamp_seconds"] <= FRESH}


class Streak:
    """One outlier followed through the judgements (:meth:`see`): it stays the outlier while it is the outlier in
    every judgement since it became one but at most :data:`MISSES` of them (a throttle's rhythm, a moment's noise:
    one judgement in four may see it level with the others; a save every other judgement is no straggler)."""

    def __init__(self):
        self.outlier: tuple[object, float] | None = None  # (who, since)
        self.hits = self.misses = 0

    def _missed(self) -> None:
        """No outlier this time, or another one: the streak holds while its misses stay within MISSES."""
        self.misses += 1
        if self.outlier is not None and self.misses > MISSES * (self.hits + self.misses):
            self.outlier = None

    def see(self, who, now: float) -> float | None:
        """``who`` is the outlier now (None: no one is): since when it has been, once that is :data:`SUSTAINED`
        seconds or more; else None."""
        if who is None:
            self._missed()
            return None
        if self.outlier is not None and self.outlier[0] != who:
            self._missed()
        if self.outlier is None:
            self.outlier, self.hits, self.misses = (who, now), 0, 0
        if self.outlier[0] != who:
            return None
        self.hits += 1
        return self.outlier[1] if now - self.outlier[1] >= SUSTAINED else None


class Judge:
    """Sees the ranks' figures again and again; names the rank that stays the outlier (:meth:`see`, a
    :class:`Streak`)."""

    def __init__(self):
        self.streak = Streak()

    def see(self, ranks: dict[int, tuple[str, dict]], now: float) -> Straggler | None:
        timed = {
            r: (node, v["step_seconds"], v["collective_wait_seconds"])
            for r, (node, v) in ranks.items()
            if "step_seconds" in v and "collective_wait_seconds" in v
        }
        if len(timed) < 2:
            self.streak = Streak()
            return None
        compute = {r: max(step - wait, 1e-9) for r, (_, step, wait) in timed.items()}
        slow = max(compute, key=lambda r: (compute[r], -r))
        typical = statistics.median(c for r, c in compute.items() if r != slow)
        outlier = compute[slow] >= SLOWER * typical and compute[slow] - typical >= AT_LEAST
        since = self.streak.see(slow if outlier else None, now)
        if since is None:
            return None
        waits = statistics.median(w for r, (_, _, w) in timed.items() if r != slow)
        evidence = (
            f"it computes {1e3 * compute[slow]:.0f} ms a step, the others {1e3 * typical:.0f} ms; they wait "
            f"{1e3 * waits:.0f} ms a step for it in the collectives, it waits {1e3 * timed[slow][2]:.0f} ms"
        )
        return Straggler(slow, timed[slow][0], compute[slow] / typical, evidence, since, now)


class GpuJudge:
    """Names the rank whose GPU stays held down (kit.monitor.training.held_down: a slowdown throttle reason, its SM
    clock well under the other nodes') for :data:`SUSTAINED` seconds — from NVML alone, before (or without) the
    ranks' waits showing it: a step that the GPU does not set (a CPU-bound loader) hides a throttled GPU."""

    def __init__(self):
        self.since: dict[tuple[str, str], float] = {}

    def see(
        self, held: dict[tuple[str, str], tuple[int, float, str]], ranks: dict[int, tuple[str, dict]], now: float
    ) -> Straggler | None:
        """``held``: each GPU held down now, by (node, GPU): (its place among its node's GPUs, slowdown, evidence);
        ``ranks``: each rank's node (:func:`latest`). The rank named is the node's rank at the GPU's place (one rank
        per GPU, as Slurm binds them), else the node's first."""
        self.since = {key: self.since.get(key, now) for key in held}
        for (node, gpu), (place, factor, evidence) in sorted(held.items()):
            on_node = sorted(r for r, (n, _) in ranks.items() if n == node)
            if not on_node or now - self.since[(node, gpu)] < SUSTAINED:
                continue
            rank = on_node[place] if place < len(on_node) else on_node[0]
            held_for = f"{evidence}, for {now - self.since[(node, gpu)]:.0f} s"
            return Straggler(rank, node, factor, held_for, self.since[(node, gpu)], now, by="gpu")
        return None


LINK_SLOWER = 5.0  # a link whose round trip is this many times the job's other busy links' median ...
LINK_AT_LEAST = 0.002  # ... and this many seconds more is slow


class LinkJudge:
    """Names the node on every slow link (kit.monitor.round_trips measures): a slow link slows every rank alike, so the
    ranks' waits cannot name it, but the round trips of the job's busy TCP connections can. A node whose every busy
    link, to at least two other nodes, has a round trip :data:`LINK_SLOWER` times the median of the busy links that
    do not touch it (and :data:`LINK_AT_LEAST` more) is the outlier — its ring neighbours each have one slow link
    and fast others; one slow link alone cannot say which end is slow — named once it stays so for
    :data:`SUSTAINED` seconds (a :class:`Streak`)."""

    def __init__(self):
        self.streak = Streak()

    def see(
        self, links: dict[str, dict[tuple[str, str], float]], ranks: dict[int, tuple[str, dict]], now: float
    ) -> Straggler | None:
        """``links``: each node's busy links, (its address, the peer's) → round trip in seconds; ``ranks``: each
        rank's node (:func:`latest`). The rank named is the node's first."""
        found = slow_link_node(links)
        since = self.streak.see(found[0] if found else None, now)
        on_node = sorted(r for r, (n, _) in ranks.items() if found and n == found[0])
        if since is None or not on_node:
            return None
        node, factor, evidence = found
        return Straggler(on_node[0], node, factor, f"{evidence}, for {now - since:.0f} s", since, now, by="link")


def slow_link_node(links: dict[str, dict[tuple[str, str], float]]) -> tuple[str, float, str] | None:
    """The node on every slow link (:class:`LinkJudge`): (node, its links' median round trip over the others',
    evidence), or None."""
    where = {local: node for node, mine in links.items() for local, _ in mine}
    edges = [
        (node, where[peer], rtt)
        for node, mine in links.items()
        for (_, peer), rtt in mine.items()
        if where.get(peer, node) != node
    ]
    best = None
    for node in sorted({n for edge in edges for n in edge[:2]}):
        touching = [(a if b == node else b, rtt) for a, b, rtt in edges if node in (a, b)]
        others = [rtt for a, b, rtt in edges if node not in (a, b)]
        if len({peer for peer, _ in touching}) < 2 or not others:
            continue
        typical = statistics.median(others)
        if all(rtt >= LINK_SLOWER * typical and rtt - typical >= LINK_AT_LEAST for _, rtt in touching):
            factor = statistics.median(rtt for _, rtt in touching) / max(typical, 1e-6)
            if best is None or factor > best[1]:
                told = ", ".join(f"with {peer} {1e3 * rtt:.1f} ms" for peer, rtt in sorted(touching))
                evidence = f"round trips {told}; the job's other busy links {1e3 * typical:.2f} ms (median)"
                best = (node, factor, evidence)
    return best


class Panel:
    """The judges together, as the first node's exporter consults them each time its poll has collected the ranks'
    figures, the GPUs held down and the busy links: the ranks' steps first (their GPUs' evidence added), then a GPU
    held down, then a node's slow links. Each judge sees every collection (each follows its own streak)."""

    def __init__(self):
        self.steps, self.gpus, self.links = Judge(), GpuJudge(), LinkJudge()

    def decide(
        self,
        ranks: dict[int, tuple[str, dict]],
        held: dict[tuple[str, str], tuple[int, float, str]],
        links: dict[str, dict[tuple[str, str], float]],
        now: float,
        evidence_of: Callable[[str], str] = lambda node: "",
    ) -> Straggler | None:
        verdict = self.steps.see(ranks, now)
        if verdict is not None and (more := evidence_of(verdict.node)):
            verdict = dataclasses.replace(verdict, evidence=f"{verdict.evidence}; {more}")
        held_down, slow_link = self.gpus.see(held, ranks, now), self.links.see(links, ranks, now)
        return verdict or held_down or slow_link
