"""Container benchmark: the README's main job with and without its image, side by side.

    python bench/bench_container.py [--image cpu-lightning.sqsh] [--pairs 3] [--steps 300] [--quick]

--quick: one pair of 10-step jobs (the test suite's run: the bench keeps working).

Needs the local cluster (`kit cluster up --nodes 2`) and a kit-built image
(the README's first command makes both). Each pair runs the same 2-node
`python3 -m kit.train` job twice, once in the image (through whichever
container plugin the cluster runs: `kit cluster status` says) and once on the
host, in alternating order so both see the same machine load. Printed per job
and as medians:

- wall time of `kit launch --wait` (submission to the end);
- the task start, as `kit report` shows it (kit.jobdir.task_starts): from the
  step's start (prelaunch, just before srun) to the slowest node's first task
  line (inside the container: the container's start);
- the ratio image/host of both.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kit import jobdir  # noqa: E402


def run_job(out: Path, steps: int, image: Path | None) -> tuple[float, float]:
    argv = [sys.executable, "-m", "kit", "launch", "--local", "--nodes", "2", "--wait", "--heartbeat", "0",
            "--output-dir", str(out), *(["--image", str(image)] if image else []), "--",
            "python3", "-m", "kit.train", "--max-steps", str(steps), "--step-delay", "0.02"]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"job failed ({proc.returncode}):\n{proc.stderr}")
    job_dir = Path(re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1))
    starts = jobdir.task_starts(job_dir, 0)  # what kit report shows: srun to each node's first task
    if not starts:
        sys.exit(f"no task starts recorded in {job_dir}/progress/r0")
    return wall, max(starts.values())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", type=Path, default=REPO / "cpu-lightning.sqsh")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--output-dir", type=Path, default=Path("/tmp/kit-bench-container"))
    p.add_argument("--quick", action="store_true", help="one pair of 10-step jobs (the test suite's run)")
    args = p.parse_args()
    if args.quick:
        args.pairs, args.steps = 1, 10
    if not args.image.is_file():
        sys.exit(f"no image {args.image}: kit build containers/cpu-lightning.toml -o {args.image}")
    status = subprocess.run([sys.executable, "-m", "kit", "cluster", "status"], capture_output=True, text=True)
    if status.returncode != 0:
        sys.exit("the local cluster is not running: kit cluster up --nodes 2")
    print(next((line.strip() for line in status.stdout.splitlines() if "containers:" in line), "containers: ?"))
    results: dict[str, list[tuple[float, float]]] = {"image": [], "host": []}
    for i in range(args.pairs):
        order = ("image", "host") if i % 2 == 0 else ("host", "image")
        for kind in order:
            wall, start = run_job(args.output_dir, args.steps, args.image if kind == "image" else None)
            results[kind].append((wall, start))
            print(f"pair {i + 1} {kind:<5}: wall {wall:6.1f} s, task start {start:5.1f} s after srun", flush=True)
    med = {k: (statistics.median(w for w, _ in v), statistics.median(s for _, s in v)) for k, v in results.items()}
    print(f"median wall time: image {med['image'][0]:.1f} s, host {med['host'][0]:.1f} s, "
          f"ratio {med['image'][0] / med['host'][0]:.2f}")
    print(f"median task start after srun: image {med['image'][1]:.1f} s, host {med['host'][1]:.1f} s "
          f"(the container's start cost: {med['image'][1] - med['host'][1]:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
