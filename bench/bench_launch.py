"""Launch-path benchmark: prints ratios measured side by side in one run.

    python bench/bench_launch.py [--runs N] [--quick]

--quick: each measurement once (the test suite's run: the bench keeps working).

1. `kit launch --dry-run` wall time against `python -c pass` (target < 0.3 s, <= 3x), beside the floor
   any click command has (`python -c 'import click'`); the cost
   `kit.launch(..., dry_run=True)` adds over it, from a fresh Python (target: ratio < 1.2)
   and warm in a process that already imported kit (a notebook's second call).
2. launcher overhead: from a task's start (bash launcher.sh) to the training
   command's first instruction (target < 0.2 s).
3. teardown: from the training command's exit to the last sidecar gone
   (target < 1 s).
4. `kit cluster up` of 2 nodes on a fresh KIT_HOME (target: well under 10 s).
5. a trivial function's round trip on that cluster: ``kit.submit(fn).result()`` against submitit's
   ``AutoExecutor.submit(fn).result()``, alternated (target: ratio <= 1.0), and where kit's seconds go:
   submission, the queue and prelaunch up to its step, srun to the launcher's task, the task to the rank's
   result (Python, kit.train.function, the call), and the result to ``result()`` returning (the launcher's
   teardown, prelaunch's end, Slurm seeing it, the wait's polling).
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kit import submission as launch
from kit.cluster import LocalCluster
from kit.core import spec as specs
from kit.jobdir import JobDir


def add(a: int, b: int) -> int:
    return a + b


def timed(argv, env=None) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def task_env(job_dir: Path) -> dict:
    """What srun gives one task, plus what prelaunch exports."""
    return {
        **os.environ,
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_NODEID": "0",
        "SLURM_JOB_ID": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "KIT_JOB_DIR": str(job_dir),
        "KIT_LOG_DIR": str(job_dir / "logs"),
        "KIT_PROGRESS_DIR": str(job_dir / "progress" / "r0"),
        "KIT_HANG_DIR": str(job_dir / "hang" / "r0"),
    }


def launcher_run(tmp: Path, i: int) -> tuple[float, float]:
    """One launcher run; returns (start->command, command exit->last sidecar gone). The command says when it
    began, waits until the sidecar has said its pid (else its teardown may come before the sidecar ran at all),
    and says when it ends."""
    pidfile = tmp / f"sidecar-{i}.pid"
    command = f"date +%s.%N; until [ -s {pidfile} ]; do sleep 0.005; done; date +%s.%N"
    job = specs.resolve(
        specs.JobSpec(
            command=["bash", "-c", command],
            output_dir=str(tmp / "jobs"),
            sidecars=[f"echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 300"],
        )
    )
    job_dir = launch.prepare(job).job_dir
    (job_dir / "progress" / "r0").mkdir(parents=True)
    env = task_env(job_dir)
    t_start = time.time()
    subprocess.run(
        ["bash", str(job_dir / "launcher.sh")],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    sidecar = int(pidfile.read_text())
    while os.path.exists(f"/proc/{sidecar}"):
        time.sleep(0.001)
    t_gone = time.time()
    t_cmd, t_exit = (float(t) for t in (job_dir / "logs" / "rank-0.r0.log").read_text().split()[:2])
    return t_cmd - t_start, t_gone - t_exit


def kit_phases(job_dir: Path, submitted: float, returned: float) -> dict[str, float]:
    """Where a function job's seconds went, from the times its job directory holds (absolute, this machine's)."""
    d = JobDir(job_dir)
    step = float((d.run_progress(0) / "step-start").read_text().split()[0])
    tasks = [float(p.read_text().split()[2]) for p in d.run_progress(0).glob(JobDir.TASK.format(rank="*"))]
    result = d.result(0).stat().st_mtime
    return {
        "queue + prelaunch to its step": step - submitted,
        "srun to the launcher's task": min(tasks) - step,
        "task to the rank's result": result - min(tasks),
        "result to result() returning": returned - result,
    }


def round_trips(cluster: LocalCluster, out: Path, runs: int) -> tuple[list, list, dict]:
    """``runs`` round trips of each, alternated: kit.submit (no exporter: submitit has none), submitit, and
    kit.submit as it comes (its exporter on each node)."""
    import submitit

    import kit

    os.environ.update(cluster.target.env)  # submitit's sbatch and squeue reach the bench's cluster
    os.environ["KIT_HOME"] = str(cluster.home)  # and kit's local=True: the bench's cluster, its own store
    executor = submitit.AutoExecutor(folder=str(out / "submitit"))
    executor.update_parameters(timeout_min=10, slurm_partition="local", cpus_per_task=1)
    kit_trip, submitit_trip, exporter_trip = [], [], []
    phases: dict[str, list] = {"submission": []}

    def idle() -> None:
        """Every trip starts on idle nodes: kit's result() returns while its job still tears down (its node
        COMPLETING), which would delay the next trip's start, whichever tool that is."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            listed = subprocess.run(["squeue", "--noheader"], capture_output=True, text=True)
            if listed.returncode == 0 and not listed.stdout.strip():
                return
            time.sleep(0.05)  # jobs still there, or a busy controller did not answer (a machine shared with others)
        raise TimeoutError("the bench's cluster did not become idle in 120 s")

    for _ in range(runs + 1):  # the first of each warms the nodes' caches: left out
        idle()
        t0 = time.perf_counter()
        wall0 = time.time()
        job = kit.submit(add, 1, 2, local=True, no_exporter=True, output_dir=str(out / "kit"))
        submitted = time.time()
        assert job.result(timeout=300) == 3
        kit_trip.append(time.perf_counter() - t0)
        returned = time.time()
        phases["submission"].append(submitted - wall0)
        for name, seconds in kit_phases(job.dir, submitted, returned).items():
            phases.setdefault(name, []).append(seconds)
        idle()
        t0 = time.perf_counter()
        assert executor.submit(add, 1, 2).result() == 3
        submitit_trip.append(time.perf_counter() - t0)
        idle()
        t0 = time.perf_counter()  # kit's default: the exporter beside the call on each node
        assert kit.submit(add, 1, 2, local=True, output_dir=str(out / "kit-exporter")).result(timeout=300) == 3
        exporter_trip.append(time.perf_counter() - t0)
    phases["the same with the exporter (kit's default), total"] = exporter_trip
    return kit_trip[1:], submitit_trip[1:], {k: v[1:] for k, v in phases.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="each measurement once (the test suite's run)")
    args = ap.parse_args()
    if args.quick:
        args.runs = 1
    # An installed kit has its bytecode (pip compiles it); a checkout run under PYTHONDONTWRITEBYTECODE would
    # compile every module it changed on each start, and time that instead.
    compileall.compile_dir(str(Path(launch.__file__).parent.parent), quiet=1)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        py, parser, imports, dry, api, warm = [], [], [], [], [], []
        api_call = (
            f"import kit; kit.launch(['python', '-m', 'kit.train'], nodes=2, dry_run=True, "
            f"output_dir={str(tmp / 'api')!r})"
        )
        import kit

        for _ in range(args.runs):  # interleaved, so all see the same machine load
            py.append(timed([sys.executable, "-c", "pass"]))
            parser.append(timed([sys.executable, "-c", "import click"]))
            imports.append(timed([sys.executable, "-c", "import kit.cli.group, kit.cli.launch"]))
            dry.append(
                timed(
                    [
                        sys.executable,
                        "-m",
                        "kit",
                        "launch",
                        "--dry-run",
                        "--output-dir",
                        str(tmp / "dry"),
                        "--nodes",
                        "2",
                        "--",
                        "python",
                        "-m",
                        "kit.train",
                    ]
                )
            )
            api.append(timed([sys.executable, "-c", api_call]))
            t0 = time.perf_counter()
            kit.launch(["python", "-m", "kit.train"], nodes=2, dry_run=True, output_dir=str(tmp / "warm"))
            warm.append(time.perf_counter() - t0)
        overhead, teardown = zip(*(launcher_run(tmp, i) for i in range(args.runs)))

        home = tmp / "home"
        cluster = LocalCluster(home)
        t0 = time.perf_counter()
        cluster.up(nodes=2, cpus_per_node=2)
        up = time.perf_counter() - t0
        try:
            trips = round_trips(cluster, tmp / "trips", args.runs)
        finally:
            cluster.down(force=True)

    med = statistics.median
    p_max = max
    print(f"runs per measurement: {args.runs}")
    print(f"{'measurement':<44}{'median':>10}{'max':>10}{'target':>10}")
    print(f"{'python -c pass':<44}{med(py):>9.3f}s{p_max(py):>9.3f}s{'':>10}")
    floor = "python -c 'import click' (the CLI parser)"
    print(f"{floor:<44}{med(parser):>9.3f}s{p_max(parser):>9.3f}s")
    print(f"{'  ratio import click / python -c pass':<44}{med(parser) / med(py):>9.2f}x")
    print(f"{'kit launch --dry-run':<44}{med(dry):>9.3f}s{p_max(dry):>9.3f}s{'< 0.300s':>10}")
    print(f"{'  ratio dry-run / python -c pass':<44}{med(dry) / med(py):>9.2f}x{'':>10}{'<= 3.00x':>10}")
    print("  where the dry run's time goes (medians' differences):")
    print(f"{'    Python starting':<44}{med(py):>9.3f}s")
    print(f"{'    importing click':<44}{med(parser) - med(py):>9.3f}s")
    print(f"{'    importing kit (its CLI and launch path)':<44}{med(imports) - med(parser):>9.3f}s")
    print(f"{'    the work (snapshot, plan, job directory)':<44}{med(dry) - med(imports):>9.3f}s")
    print(f"{'kit.launch(dry_run=True), fresh python':<44}{med(api):>9.3f}s{p_max(api):>9.3f}s")
    print(f"{'  ratio kit.launch / kit launch --dry-run':<44}{med(api) / med(dry):>9.2f}x{'':>10}{'< 1.20x':>10}")
    print(f"{'kit.launch(dry_run=True), warm, in-process':<44}{med(warm):>9.3f}s{p_max(warm):>9.3f}s")
    print(f"{'launcher: task start -> command exec':<44}{med(overhead):>9.3f}s{p_max(overhead):>9.3f}s{'< 0.200s':>10}")
    print(
        f"{'launcher: command exit -> last sidecar gone':<44}{med(teardown):>9.3f}s{p_max(teardown):>9.3f}s"
        f"{'< 1.000s':>10}"
    )
    print(f"{'kit cluster up (2 nodes, fresh)':<44}{up:>9.3f}s{'':>10}{'< 10.00s':>10}")
    kit_trip, submitit_trip, phases = trips
    print(f"{'kit.submit(fn).result(), local cluster':<44}{med(kit_trip):>9.3f}s{p_max(kit_trip):>9.3f}s")
    print(f"{'submitit AutoExecutor.submit(fn).result()':<44}{med(submitit_trip):>9.3f}s{p_max(submitit_trip):>9.3f}s")
    ratio = med(kit_trip) / med(submitit_trip)
    print(f"{'  ratio kit / submitit':<44}{ratio:>9.2f}x{'':>10}{'<= 1.00x':>10}")
    for name, values in phases.items():
        print(f"{'    kit: ' + name:<44}{med(values):>9.3f}s")
    ok = med(dry) < 0.3 and med(overhead) < 0.2 and med(teardown) < 1.0 and up < 10 and med(api) / med(dry) < 1.2
    ok = ok and med(dry) / med(py) <= 3.0 and ratio <= 1.0
    print("targets met" if ok else "TARGETS MISSED")


if __name__ == "__main__":
    main()
