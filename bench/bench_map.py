"""kit.map at scale: prints, measured side by side in one run on the
local cluster,

1. submission of ``kit.map`` over N items (default 1,000; each item pickled, a task directory
   and payload written, one sbatch of an N-task array, held so nothing runs) against a bare
   ``sbatch --array=0-(N-1) --hold --wrap true`` of the same size (target: kit ≤ 5 s at 1,000);
2. a map over M items run to its end (default 100): the squeues its waits and results made
   (one per poll for the whole array, never one per item) and the time ``[j.result() for j in
   jobs]`` takes once every task is known final (each result read once, no Slurm query).

    python bench/bench_map.py [--items N] [--run M] [--quick]

--quick: 50 items submitted, 8 run (the suite's run: the bench keeps working).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kit
from kit.cluster import LocalCluster
from kit.slurm import status as slurm_status


def square(x: int) -> int:
    return x * x


def counted() -> list:
    """Every squeue kit's status code makes, counted."""
    calls, real = [], slurm_status._squeue_jobs
    slurm_status._squeue_jobs = lambda target, patience: calls.append(1) or real(target, patience)
    return calls


def submit_side_by_side(cluster: LocalCluster, out: Path, items: int) -> tuple[float, float]:
    env = {**os.environ, "SLURM_CONF": str(cluster.conf)}
    t0 = time.perf_counter()
    bare = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--hold",
            f"--array=0-{items - 1}",
            "--wrap",
            "true",
            f"--output={out}/bare-%A_%a.out",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    t_bare = time.perf_counter() - t0
    t0 = time.perf_counter()
    jobs = kit.map(
        square, range(items), local=True, output_dir=str(out / "held"), no_exporter=True, sbatch_arg=["--hold"]
    )
    t_kit = time.perf_counter() - t0
    for job_id in (bare.stdout.strip().split(";")[0], jobs[0].id.split("_")[0]):
        queued = subprocess.run(
            ["squeue", "--array", f"--jobs={job_id}", "--noheader", "--format=%i"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        subprocess.run(["scancel", job_id], env=env, check=True)
        assert len(queued) == items, f"job {job_id}: {len(queued)} tasks queued, not {items}"
    return t_bare, t_kit


def run_to_end(out: Path, items: int) -> tuple[int, float, float, int]:
    calls = counted()
    t0 = time.perf_counter()
    jobs = kit.map(square, range(items), local=True, output_dir=str(out / "run"), no_exporter=True)
    for job in jobs:
        job.wait(timeout=1800)
    waited, took = len(calls), time.perf_counter() - t0
    t0 = time.perf_counter()
    results = [job.result() for job in jobs]
    read = time.perf_counter() - t0
    assert results == [square(i) for i in range(items)], results
    return waited, took, read, len(calls) - waited


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=1000)
    p.add_argument("--run", type=int, default=100)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    items, run = (50, 8) if args.quick else (args.items, args.run)
    cluster = LocalCluster()
    if not cluster.running():
        print("bench_map: no local cluster running (kit cluster up)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-map-") as tmp:
        out = Path(tmp)
        t_bare, t_kit = submit_side_by_side(cluster, out, items)
        print(
            f"submit {items} items: kit.map {t_kit:.2f} s, bare sbatch --array {t_bare:.2f} s "
            f"(kit/bare {t_kit / t_bare:.1f}x; {1000 * (t_kit - t_bare) / items:.2f} ms per item; target ≤ 5 s at 1,000)"
        )
        waited, took, read, more = run_to_end(out, run)
        print(
            f"map over {run} items run to the end in {took:.1f} s: {waited} squeue(s) while waiting "
            f"({waited / run:.2f} per item; one per poll for the whole array), then [j.result() for j in jobs] "
            f"in {1000 * read:.0f} ms with {more} squeue(s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
