"""Recovery, side by side in one run: kit's checkpoints against today's every-50-steps save.

    python bench/bench_recovery.py [--quick] [--kit-home DIR]

Jobs of the reference trainer (4 nodes of 1 rank; --quick: 2 nodes of 2 ranks), with ``--on-failure restart`` and,
where a node is lost, one spare node, on a throw-away cluster of one node more (or the one up under --kit-home, which needs
that many). Into each a failure is injected once the run is well under way:

- kit, a rank killed (SIGKILL of one rank's process; no spare: the run restarts on the same nodes): the next run
  resumes from the nodes' memory;
- kit, a node lost (its ranks and its keeper killed, its memory and disk tiers removed): the spare takes its ranks'
  state from the copy on its peer;
- today (``--no-snapshots --checkpoint-every 50``: Lightning's last.ckpt, saved synchronously in the job directory),
  a rank killed and a node lost (the same kills: a node's loss costs it nothing more, its checkpoint is shared).
  --quick runs today's node loss alone.

Measured for each: the steps redone (the furthest step the failed run made, from rank 0's log of every step, less the
step the next run resumed from; targets: <= 1 for a killed rank, <= the interval kit chose for a lost node), the
seconds from the failure to the next run's first step (kit's from the peer's copy against today's from shared
storage), what a save blocks of a step (kit's snapshots: the ranks' own measure, target <= 1 %; today's: the saves'
time over the steps'), and the goodput a failure every 10 minutes' worth of steps would leave, modelled from those
measured parts: 1 - (the restart's seconds + the redone steps' seconds) / 600 s - the blocking share (target >= 90 %);
kit's jobs are told that failure rate (``--mtbf 600``), from which they choose their interval.
It prints TARGETS MISSED when one is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import wait_for  # noqa: E402

from kit import files  # noqa: E402
from kit.cluster import LocalCluster  # noqa: E402
from kit.jobdir import goodput  # noqa: E402

PERIOD = 600.0  # a failure every 10 minutes' worth of steps


def launch(cluster: LocalCluster, out: Path, shape: tuple[int, int], train: list[str], spare: int) -> Path:
    nodes, per_node = shape
    proc = subprocess.run(
        [sys.executable, "-m", "kit", "launch", "--local", "--json", "--heartbeat", "0", "--output-dir", str(out),
         "--nodes", str(nodes), "--ntasks-per-node", str(per_node), "--spare-nodes", str(spare), "--on-failure", "restart",
         "--max-restarts", "1", "--", sys.executable, "-m", "kit.train", "--log-every", "1", *train],
        capture_output=True, text=True, env={**os.environ, "KIT_HOME": str(cluster.home)},
    )  # fmt: skip
    if proc.returncode:
        sys.exit(f"bench_recovery: kit launch failed ({proc.returncode}): {proc.stderr.strip()}")
    return Path(json.loads(proc.stdout)["job_dir"])


def logged_step(job_dir: Path, run: int) -> int:
    """The furthest step rank 0 logged in ``run`` (it logs every step)."""
    try:
        text = (job_dir / "logs" / f"rank-0.r{run}.log").read_text(errors="replace")
    except OSError:
        return 0
    return max([0] + [int(s) for s in re.findall(r"step=(\d+) loss", text)])


def node_pids(job_dir: Path, node: str) -> list[int]:
    pids = []
    for p in (job_dir / "progress" / "r0").glob("task-*"):
        words = p.read_text().split()
        if words and words[0] == node:
            pids.append(int(words[1]))
    return pids


def fail(job_dir: Path, how: str, tiers: tuple[Path, Path] | None) -> float:
    """Inject the failure; its time."""
    if how == "node":
        keeper = job_dir / "checkpoints" / "keepers" / "r0" / "node1.json"
        if keeper.exists():
            os.kill(json.loads(keeper.read_text())["pid"], signal.SIGKILL)
        pids = node_pids(job_dir, "node1")
    else:
        pids = node_pids(job_dir, "node1")[-1:]
    when = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    for base in tiers or ():
        for lost in base.glob("kit-ckpt-*/*/node1"):
            files.remove_tree(lost)
    return when


def first_step(job_dir: Path, run: int) -> float | None:
    try:
        line = next(
            ln
            for ln in (job_dir / "progress" / f"r{run}" / "timeline-0").read_text().splitlines()
            if ln.startswith("first ")
        )
    except (OSError, StopIteration):
        return None
    return float(line.split()[1])


def one(cluster: LocalCluster, tmp: Path, shape, kit_side: bool, how: str) -> dict:
    """One job with one failure: what it cost."""
    name = f"{'kit' if kit_side else 'today'}-{how}"
    memory, local = tmp / name / "shm", tmp / name / "disk"
    memory.mkdir(parents=True)
    local.mkdir()
    args = ["--step-delay", "0.05"]
    # kit's interval for a failure every 10 minutes (--mtbf: what the modelled goodput assumes), against today's 50 steps
    kits = [f"--checkpoint-memory={memory}", f"--checkpoint-local={local}", "--mtbf", str(int(PERIOD))]
    args += kits if kit_side else ["--no-snapshots", "--checkpoint-every", "50"]
    at = 75  # today's: between two saves (50 and 100)
    # A killed rank's run restarts on the same nodes (with a spare, prelaunch would leave the rank's node out); a lost
    # node's on the spare.
    spare = 0 if how == "rank" else 1
    job_dir = launch(cluster, tmp / name / "jobs", shape, [*args, "--max-steps", "100000"], spare)
    every = None
    if kit_side:  # fail once the first interval kit chose has been in force two periods, and the ranks said their cost
        decided = job_dir / "checkpoints" / "interval.jsonl"

        def applied():  # the first interval kit chose in force for two of its periods
            lines = decided.exists() and decided.read_text().splitlines()
            if not lines:
                return None
            first = json.loads(lines[0])
            told = "snapshots blocked" in (job_dir / "logs" / "rank-0.r0.log").read_text(errors="replace")
            return told and logged_step(job_dir, 0) >= first["from_step"] + 2 * first["every_steps"]

        wait_for(applied, 300)
        at = logged_step(job_dir, 0)
    else:
        wait_for(lambda: logged_step(job_dir, 0) >= at, 300)
    failed_at = fail(job_dir, how, (memory, local) if kit_side and how == "node" else None)
    reached = logged_step(job_dir, 0)
    wait_for(lambda: first_step(job_dir, 1) is not None, 300)
    resumed_log = (job_dir / "logs" / "rank-0.r1.log").read_text(errors="replace")
    m = re.search(r"resum\w* (?:at|from .*last\.ckpt at) step (\d+)", resumed_log)
    resumed = int(m.group(1)) if m else 0
    if kit_side:
        restore = json.loads((job_dir / "checkpoints" / "restore.r1.json").read_text())
        resumed, reached = restore["step"], max(reached, restore["newest_held"])
        chosen = [json.loads(line) for line in (job_dir / "checkpoints" / "interval.jsonl").read_text().splitlines()]
        every = max(c["every_steps"] for c in chosen if c["from_step"] <= reached)  # in force before the failure
    subprocess.run(
        ["scancel", Path(job_dir / "job_id").read_text().strip()], env={**os.environ, **cluster.target.env}, check=False
    )
    wait_for(
        lambda: (job_dir / "runs.jsonl").exists() and len((job_dir / "runs.jsonl").read_text().splitlines()) >= 2, 120
    )
    spent = goodput.goodput(job_dir, running=False)
    logs = "".join(p.read_text(errors="replace") for p in (job_dir / "logs").glob("rank-*.log"))
    blocked = [float(x) for x in re.findall(r"snapshots blocked ([0-9.]+) % of a step", logs)]
    if kit_side:
        blocking = max(blocked) / 100 if blocked else None
    else:
        parts = spent.parts if spent else {}
        blocking = parts.get("checkpoint", 0.0) / max(parts.get("productive", 0.0) + parts.get("checkpoint", 0.0), 1e-9)
    step_s = (spent.parts["productive"] / max(reached, 1)) if spent else 0.05
    return {
        "name": name,
        "redone": reached - resumed,
        "resumed": resumed,
        "reached": reached,
        "every": every,
        "to_first_step": first_step(job_dir, 1) - failed_at,
        "blocking": blocking,
        "step_s": step_s,
        "tiers": sorted(
            {json.loads(p.read_text())["tier"] for p in (job_dir / "checkpoints").glob("loaded.r1.*.json")}
        ),
    }


def modelled(r: dict) -> float:
    lost = r["to_first_step"] + r["redone"] * r["step_s"]
    return 1 - lost / PERIOD - (r["blocking"] or 0.0)


def measure(cluster: LocalCluster, tmp: Path, quick: bool) -> int:
    shape = (2, 2) if quick else (4, 1)
    runs = [(True, "rank"), (True, "node"), (False, "node")] + ([] if quick else [(False, "rank")])
    results = [one(cluster, tmp, shape, k, how) for k, how in runs]
    missed = []
    for r in results:
        share = "?" if r["blocking"] is None else f"{100 * r['blocking']:.2f} %"
        print(
            f"{r['name']:11s} redone {r['redone']:3d} step(s) (reached {r['reached']}, resumed {r['resumed']}"
            f"{', interval ' + str(r['every']) if r['every'] else ''}, from {'+'.join(r['tiers']) or 'last.ckpt'}); "
            f"failure -> next run's first step {r['to_first_step']:.1f} s; a save blocks {share} of a step; "
            f"goodput at a failure every 10 min (modelled) {100 * modelled(r):.1f} %"
        )
    by = {r["name"]: r for r in results}
    if by["kit-rank"]["redone"] > 1:
        missed.append("a killed rank redid more than 1 step")
    if by["kit-node"]["redone"] > by["kit-node"]["every"]:
        missed.append("a lost node redid more than the chosen interval")
    if any(by[n]["blocking"] is None or by[n]["blocking"] > 0.01 for n in ("kit-rank", "kit-node")):
        missed.append("a snapshot blocked more than 1 % of a step")
    if any(modelled(by[n]) < 0.9 for n in ("kit-rank", "kit-node")):
        missed.append("goodput at a failure every 10 minutes under 90 %")
    ratio = by["today-node"]["to_first_step"] / max(by["kit-node"]["to_first_step"], 1e-9)
    print(f"a lost node to the next run's first step: today's (shared storage) / kit's (the peer's copy) = {ratio:.2f}")
    steps = by["today-node"]["redone"] / max(by["kit-node"]["redone"], 1)
    print(f"steps redone for a lost node: today's / kit's = {steps:.1f}")
    if missed:
        print("TARGETS MISSED: " + "; ".join(missed))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--kit-home", default=None)
    args = p.parse_args()
    nodes = (2 if args.quick else 4) + 1
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/var/tmp")) as d:
        tmp = Path(d)
        if args.kit_home:
            return measure(LocalCluster(Path(args.kit_home)), tmp, args.quick)
        cluster = LocalCluster(tmp / "home")
        cluster.up(nodes=nodes, cpus_per_node=2)
        try:
            return measure(cluster, tmp, args.quick)
        finally:
            cluster.down(force=True)


if __name__ == "__main__":
    sys.exit(main())
