"""A node's preflight record and the job's verdict over all of them.

Each node's local rank 0 checks its node (:func:`check_node`: its GPUs' health, a burn-in) and writes
``progress/r<run>/preflight-<node>.json``; the first node's judges them all once every node has written (or the
wait is over: :func:`judge`) and writes the verdict, ``progress/r<run>/preflight`` (``key=value`` lines, as a hang
report: ``verdict=ok|failed``, ``nodes=`` the nodes to leave out, ``why=``), which every task waits for before
its command starts and prelaunch reads at the step's end.
"""

from __future__ import annotations

import json
import socket
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from kit import files
from kit.jobdir.layout import JobDir
from kit.jobdir.runs import fields_text
from kit.preflight import burn, health

SLOW = 0.5  # a node's burn-in under this share of the median node's fails it
SLOW_LINK = 0.5  # --preflight-network: a node whose every link is under this share of the median link fails
GPU_FAIL, GPU_WARN = 0.3, 0.6  # a GPU's burn-in under these shares of its datasheet peak: fails it / is told


def check_node(node: str | None = None, burn_seconds: float = burn.SECONDS, env: dict | None = None, say=print) -> dict:
    """This node's record: its findings (health's, an Xid during the burn-in, a GPU far under its peak), the GPUs
    seen, the burn-in (none on a node that failed already)."""
    t0 = time.monotonic()
    findings, seen, burned = health.check_gpus(env, lambda: burn.burn_in(burn_seconds), say)
    burned = burned or {"device": None}
    for gpu in burned.get("gpus", []):
        share = gpu.get("of_peak")
        if share is not None and share < GPU_WARN:
            level = "fail" if share < GPU_FAIL else "warn"
            findings.append(
                health.Finding(level, f"matmul burn-in {gpu['tflops']:.0f} TFLOP/s: {100 * share:.0f} % of its peak")
            )
    return {
        "node": node or socket.gethostname(),
        "ok": not any(f.level == "fail" for f in findings),
        "findings": [asdict(f) for f in findings],
        "gpus": seen,
        "burn": burned,
        "seconds": round(time.monotonic() - t0, 3),
        "time": time.time(),
    }


def node_score(record: dict) -> float | None:
    """A node's burn-in as one number (its slowest GPU's TFLOP/s, or its CPUs'), to hold against the others."""
    burned = record.get("burn") or {}
    if burned.get("gpus"):
        return min(g["tflops"] for g in burned["gpus"])
    return burned.get("tflops")


def records(directory: Path) -> dict[str, dict]:
    """Every node's record in a run's progress directory (unreadable ones left out)."""
    out = {}
    for path in sorted(Path(directory).glob(JobDir.PREFLIGHT_NODE.format(node="*"))):
        try:
            record = files.loads(files.read_text(path, 1 << 20))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("node"), str):
            out[record["node"]] = record
    return out


def decide(found: dict[str, dict], expected: int) -> dict:
    """The verdict over the nodes' records: the nodes that fail (a finding that fails, or a burn-in under
    :data:`SLOW` of the median node's), why, and how many nodes gave none."""
    failed: dict[str, str] = {}
    for node, rec in found.items():
        fails = [f for f in rec.get("findings", []) if f.get("level") == "fail"]
        if fails:
            failed[node] = "; ".join(health.Finding(**f).line() for f in fails)
    scores = {n: s for n, r in found.items() if (s := node_score(r)) is not None and n not in failed}
    if len(scores) >= 2:
        median = statistics.median(scores.values())
        for node, score in scores.items():
            if median > 0 and score < SLOW * median:
                failed[node] = f"burn-in {score:.3g} TFLOP/s, {100 * score / median:.0f} % of the median node's"
    failed.update({n: text for n, text in network_failures(found).items() if n not in failed})
    missing = max(expected - len(found), 0)
    why = [f"{node}: {text}" for node, text in sorted(failed.items())]
    if missing:
        why.append(f"{missing} of {expected} node(s) gave no preflight record")
    return {
        "verdict": "failed" if failed or missing else "ok",
        "nodes": sorted(failed),
        "why": " | ".join(why),
        "checked": sorted(found),
    }


def links(found: dict[str, dict]) -> dict[tuple[str, str], float]:
    """Each pair of nodes' link (MB/s), the slower of what its two ends measured."""
    return pair_rates({node: (rec.get("network") or {}).get("links") or {} for node, rec in found.items()})


def pair_rates(measured: dict[str, dict]) -> dict[tuple[str, str], float]:
    """Each pair of nodes' link (MB/s) from each node's own measures (``{node: {other: MB/s}}``), the slower end's."""
    out: dict[tuple[str, str], float] = {}
    for node, own in measured.items():
        for other, rate in own.items():
            if isinstance(rate, (int, float)):
                pair = (min(node, other), max(node, other))
                out[pair] = min(out.get(pair, float(rate)), float(rate))
    return out


def every_link_slow(measured: dict[str, dict]) -> dict[str, str]:
    """The nodes whose every link is under :data:`SLOW_LINK` of a node's fastest link, typically (three nodes at
    least: one slow pair cannot say which end is slow), with why; ``measured``: each node's own measures."""
    rates = pair_rates(measured)
    mine = {n: {(b if a == n else a): r for (a, b), r in rates.items() if n in (a, b)} for n in measured}
    best = [max(m.values()) for m in mine.values() if m]  # each node's fastest link: a slow node's is slow too
    out: dict[str, str] = {}
    if len(measured) >= 3 and best:
        typical = statistics.median(best)
        for node, own in mine.items():
            if own and typical > 0 and all(r < SLOW_LINK * typical for r in own.values()):
                said = ", ".join(f"to {other} {r:.0f}" for other, r in sorted(own.items()))
                out[node] = f"every link slow ({said} MB/s; a node's fastest, typically: {typical:.0f})"
    return out


def network_failures(found: dict[str, dict]) -> dict[str, str]:
    """``--preflight-network``'s: a node whose every link is slow (:func:`every_link_slow`), and a node whose test
    failed while others' ran."""
    tested = {n: r["network"] for n, r in found.items() if isinstance(r.get("network"), dict)}
    broken = {n: str(t["error"]) for n, t in tested.items() if t.get("error")}
    out = {n: f"network test: {e}" for n, e in broken.items()} if len(broken) < len(tested) else {}
    for node, why in every_link_slow({n: t.get("links") or {} for n, t in tested.items()}).items():
        out.setdefault(node, why)
    return out


def judge(directory: Path, expected: int, timeout: float = 300.0) -> dict:
    """Wait (up to ``timeout``) for ``expected`` nodes' records in ``directory``, decide, write the verdict."""
    deadline = time.monotonic() + timeout
    found = records(directory)
    while len(found) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
        found = records(directory)
    verdict = decide(found, expected)
    files.write_atomic(Path(directory) / JobDir.PREFLIGHT, fields_text(verdict))
    return verdict


def write_record(path: Path, record: dict) -> None:
    files.write_atomic(path, json.dumps(record, indent=1) + "\n")
