"""How often a job's snapshots are persisted: Young/Daly's interval, sqrt(2 x the cost of a persist x the time
between failures), from the costs the keepers measure and the job's own failures (no torch)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time

from kit import files
from kit.jobdir import JobDir
from kit.train import snapshots as S

DEFAULT_MTBF = 24 * 3600.0  # the time between failures a job assumes before it has seen any (docs/trainer.md)


FIRST_EVERY = 10  # before kit has measured a persist and a step: every 10th step to the node's disk and its peer
LEAD = 15.0  # a new interval applies from a step this many seconds ahead: every rank and keeper has read it by then


def decisions(where: S.Place) -> list[dict]:
    """Every interval chosen for the job, oldest first (``checkpoints/interval.jsonl``)."""
    out = []
    with contextlib.suppress(OSError, ValueError):
        for line in files.read_text(where.checkpoints / JobDir.CKPT_INTERVAL, 1 << 20).splitlines():
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                if isinstance(value, dict) and {"every_steps", "shared_every", "from_step"} <= set(value):
                    out.append(value)
    return out


def plan_at(chosen: list[dict], step: int) -> dict:
    """The decision that applies to ``step`` (before any: every :data:`FIRST_EVERY`-th step to the node and its
    peer, the job directory only at the end)."""
    plan = {"every_steps": FIRST_EVERY, "shared_every": 0, "from_step": 0}
    for decision in chosen:
        if int(decision["from_step"]) <= step:
            plan = decision
    return plan


def due(chosen: list[dict], step: int, final: bool = False) -> tuple[bool, bool]:
    """Whether ``step`` is persisted to the node's disk and its peer, and whether to the job directory too: the
    same answer on every node (the decisions apply from steps ahead of every rank)."""
    plan = plan_at(chosen, step)
    offset, every, shared = step - int(plan["from_step"]), int(plan["every_steps"]), int(plan["shared_every"])
    local = final or offset % every == 0
    return local, final or (local and shared > 0 and offset % (every * shared) == 0)


def mtbf(where: S.Place) -> tuple[float, str]:
    """The time between this job's failures (its runs so far), else ``$KIT_MTBF`` (``--mtbf``), else the default."""
    from kit.jobdir import records

    ended = [r for r in records.run_records(where.job_dir) if r.start_ms > 0 and r.end_ms >= r.start_ms]
    failures = [r for r in ended if r.end not in ("finished", "requeued", "stopped")]
    if failures:
        spent = sum((r.end_ms - r.start_ms) / 1000 for r in ended)
        return max(spent / len(failures), 1.0), f"this job's {len(failures)} failure(s) in {spent:.0f} s of runs"
    with contextlib.suppress(ValueError):
        if float(os.environ.get("KIT_MTBF", "0")) > 0:
            return float(os.environ["KIT_MTBF"]), "--mtbf"
    return DEFAULT_MTBF, "the default: no failure seen yet, no --mtbf"


def decide(where: S.Place, costs: dict, memory: dict) -> dict | None:
    """Young/Daly: persist every sqrt(2 * cost * MTBF) seconds, in steps; the shared tier alike, in persists.
    A fixed ``$KIT_CHECKPOINT_EVERY`` (N steps, or Ns) overrides the local interval. None until measured."""
    step_s = step_seconds(memory)
    if step_s is None or step_s <= 0 or not costs["local"]:
        return None
    cost_local = sorted(costs["local"][-20:])[len(costs["local"][-20:]) // 2]
    cost_shared = sorted(costs["shared"][-20:])[len(costs["shared"][-20:]) // 2] if costs["shared"] else cost_local
    between, why = mtbf(where)
    fixed = os.environ.get("KIT_CHECKPOINT_EVERY", "auto")
    if fixed != "auto":
        every = max(1, round(float(fixed[:-1]) / step_s) if fixed.endswith("s") else int(fixed))
        reason = f"--checkpoint-every {fixed}"
    else:
        every = max(1, round(math.sqrt(2 * cost_local * between) / step_s))
        reason = f"Young/Daly: sqrt(2 x {cost_local:.3f} s a persist x {between:.0f} s between failures ({why}))"
    stride = joint_stride(where)  # a multiple of the steps the ranks snapshot
    every = -(-every // stride) * stride
    shared_every = max(1, round(math.sqrt(2 * cost_shared * between) / (every * step_s)))
    newest = max((s for steps in memory.values() for s in steps), default=0)
    ahead = -(-(newest + math.ceil(LEAD / step_s)) // stride) * stride
    return {
        "time": time.time(),
        "from_step": ahead,
        "every_steps": every,
        "shared_every": shared_every,
        "step_seconds": round(step_s, 4),
        "cost_local": round(cost_local, 4),
        "cost_shared": round(cost_shared, 4),
        "mtbf": round(between, 1),
        "why": reason,
    }


def joint_stride(where: S.Place) -> int:
    """Every how many steps the ranks snapshot (``checkpoints/stride``; 1 when none said)."""
    try:
        return max(int(files.read_text(where.checkpoints / JobDir.CKPT_STRIDE, 32).strip() or 1), 1)
    except (OSError, ValueError):
        return 1


def step_seconds(memory: dict) -> float | None:
    """A step's time: the median over this node's ranks of their two newest snapshots' times apart, per step."""
    rates = []
    for steps in memory.values():
        newest = sorted(steps)[-2:]
        if len(newest) == 2 and all(steps[s].get("time") for s in newest):
            rates.append((steps[newest[1]]["time"] - steps[newest[0]]["time"]) / (newest[1] - newest[0]))
    return sorted(rates)[len(rates) // 2] if rates else None
