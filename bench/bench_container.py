"""Container benchmark: the README's main job on the host and in its image, in both of pyxis's
modes (create: the image unpacked on each node first; squashfuse: read through FUSE), and in create
mode under pyxis's container_scope=job (kit names the container; the job epilog removes it), side by
side.

    python bench/bench_container.py [--image cpu-lightning.sqsh] [--rounds 3] [--steps 100] [--quick]

--quick: one round of 10-step jobs, host, create and squashfuse (the test suite's run: the bench
keeps working).

Needs the local cluster (`kit cluster up --nodes 2`) and a kit-built image (the README's
first command makes both); it runs on whichever container plugin the cluster runs (real
pyxis + enroot, or kit's stand-in: `kit cluster status` says), switching the cluster's mode
with `kit cluster up --create/--squashfuse --container-scope global/job` between jobs and back to
what it was at the end (create-job on real pyxis needs .ci/real-pyxis's enroot for the epilog).
Each round runs the same 2-node `python3 -m kit.train` job once per mode, in rotating
order so all see the same machine load. Per job and as medians, from the step's start
(prelaunch's clock just before srun, progress/r0/step-start):

- per node, srun -> the command's first line (inside the container: after its start);
- srun -> the first training step (rank 0's `step=1`: imports, rendezvous, the first batch);
- the training's end -> the batch script's end (prelaunch's last record: the end of the job's
  wall time; create mode's `enroot remove` runs after the tasks, inside it);
- the training's end -> the next job can start: `kit launch --wait` returns once Slurm has the job
  COMPLETED, after its epilog (where create-job's removal runs).

Then the targets: the first step in squashfuse mode <= 1.3x create mode's, and
create mode's removal <= 1 s or out of the job's wall time.
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

from kit.jobdir import JobDir  # noqa: E402

MODES = ("host", "create", "squashfuse", "create-job")
# Each output line stamped with the node's clock (the same clock as step-start: one machine).
STAMP = 'while IFS= read -r line; do printf "%s %s\\n" "$EPOCHREALTIME" "$line"; done'


def command(steps: int) -> list[str]:
    train = f"python3 -u -m kit.train --max-steps {steps} --log-every 1000 --checkpoint-every 0"
    return ["bash", "-c", f'printf "%s first-line\\n" "$EPOCHREALTIME"; {train} 2>&1 | {STAMP}']


# A bench job runs ~10-60 s: one still running after this is stuck, and the bench says where instead of hanging.
JOB_LIMIT = 300


def kit(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        said = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr))
        sys.exit(f"kit {' '.join(args)} did not return in {timeout:.0f} s:\n{said}{stuck(said)}")
    if check and proc.returncode != 0:
        sys.exit(f"kit {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


def stuck(said: str) -> str:
    """What a job that did not end in time shows (its Slurm state, every rank's last lines), then cancelled."""
    found = re.search(r"^job dir: (.+)$", said, re.M)
    if not found:
        return ""
    where = found.group(1)
    shown = {what: kit(what, where, check=False, timeout=60) for what in ("ps", "logs")}
    kit("cancel", where, check=False, timeout=60)
    return "".join(f"\n$ kit {what}\n{p.stdout[-4000:]}{p.stderr[-2000:]}" for what, p in shown.items())


def set_mode(mode: str) -> None:
    if mode != "host":
        kit(
            "cluster",
            "up",
            "--squashfuse" if mode == "squashfuse" else "--create",
            "--container-scope",
            "job" if mode == "create-job" else "global",
        )


def stamps(job_dir: Path, rank: int) -> list[tuple[float, str]]:
    (log,) = [path for _, r, path in JobDir(job_dir).rank_logs(0) if r == rank]
    out = []
    for line in log.read_text(errors="replace").splitlines():
        head, _, rest = line.partition(" ")
        try:
            out.append((float(head.replace(",", ".")), rest))
        except ValueError:
            continue
    return out


def run_job(out: Path, steps: int, image: Path | None) -> dict:
    argv = [
        "launch",
        "--local",
        "--nodes",
        "2",
        "--wait",
        "--heartbeat",
        "0",
        "--output-dir",
        str(out),
        *(["--image", str(image)] if image else []),
        "--",
        *command(steps),
    ]
    t0 = time.time()
    proc = kit(*argv, check=False, timeout=JOB_LIMIT)
    ended = time.time()
    if proc.returncode != 0:
        sys.exit(f"job failed ({proc.returncode}):\n{proc.stderr}")
    job_dir = Path(re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1))
    step = float((JobDir(job_dir).run_progress(0) / JobDir.STEP_START).read_text().strip())
    first = {}
    for rank in (0, 1):
        lines = stamps(job_dir, rank)
        first[rank] = next(t for t, text in lines if text == "first-line") - step
    lines = stamps(job_dir, 0)
    first_step = next(t for t, text in lines if "step=1 " in text) - step
    done = next(t for t, text in lines if "done at step=" in text)
    in_job = (job_dir / JobDir.RUNS).stat().st_mtime - done
    return {"wall": ended - t0, "first_line": first, "first_step": first_step, "in_job": in_job, "after": ended - done}


def report(results: dict[str, list[dict]]) -> None:
    med = {
        m: {
            k: statistics.median(r[k] if k != "first_line" else max(r[k].values()) for r in rs)
            for k in ("wall", "first_line", "first_step", "in_job", "after")
        }
        for m, rs in results.items()
        if rs
    }
    print(f"{'median':<12} {'first line':>10} {'first step':>10} {'end->job end':>12} {'end->next':>10} {'wall':>8}")
    for mode, m in med.items():
        print(
            f"{mode:<12} {m['first_line']:>9.2f}s {m['first_step']:>9.2f}s {m['in_job']:>11.2f}s "
            f"{m['after']:>9.2f}s {m['wall']:>7.1f}s"
        )
    if "create" in med and "squashfuse" in med:
        ratio = med["squashfuse"]["first_step"] / med["create"]["first_step"]
        print(f"first step, squashfuse / create: {ratio:.2f} (target <= 1.3): {'met' if ratio <= 1.3 else 'MISSED'}")
    for mode in ("create", "create-job"):
        if mode in med and "host" in med:
            extra = med[mode]["in_job"] - med["host"]["in_job"]
            print(
                f"{mode} mode's end of the job beyond the host's (a removal inside the job): {extra:+.2f} s "
                f"(target <= 1 s): {'met' if extra <= 1.0 else 'MISSED'}; until the next job can start: "
                f"{med[mode]['after'] - med['host']['after']:+.2f} s"
            )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", type=Path, default=REPO / "cpu-lightning.sqsh")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, of " + ", ".join(MODES))
    p.add_argument("--output-dir", type=Path, default=Path("/tmp/kit-bench-container"))
    p.add_argument("--quick", action="store_true", help="one round of 10-step jobs (the test suite's run)")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.steps, args.modes = 1, 10, "host,create,squashfuse"
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= set(MODES):
        sys.exit(f"--modes: of {', '.join(MODES)}")
    if not args.image.is_file():
        sys.exit(f"no image {args.image}: kit build containers/cpu-lightning.toml -o {args.image}")
    status = kit("cluster", "status", check=False)
    if status.returncode != 0:
        sys.exit("the local cluster is not running: kit cluster up --nodes 2")
    print(next((line.strip() for line in status.stdout.splitlines() if "containers:" in line), "containers: ?"))
    was = [
        "--squashfuse" if "squashfuse mode" in status.stdout else "--create",
        "--container-scope",
        "job" if "container_scope=job" in status.stdout else "global",
    ]
    results: dict[str, list[dict]] = {m: [] for m in modes}
    try:
        for i in range(args.rounds):
            for mode in modes[i % len(modes) :] + modes[: i % len(modes)]:
                print(f"round {i + 1} {mode:<10}:", end="", flush=True)  # a stuck step shows where it stands
                set_mode(mode)
                print(" (mode set)", end="", flush=True)
                r = run_job(args.output_dir, args.steps, None if mode == "host" else args.image)
                results[mode].append(r)
                lines = ", ".join(f"node{k + 1} {v:.2f} s" for k, v in sorted(r["first_line"].items()))
                print(
                    f" first line {lines}; first step {r['first_step']:.2f} s; "
                    f"end -> job's end {r['in_job']:.2f} s, -> next job {r['after']:.2f} s; wall {r['wall']:.1f} s",
                    flush=True,
                )
    finally:
        kit("cluster", "up", *was)
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
