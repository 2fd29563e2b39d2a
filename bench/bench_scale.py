"""What a job costs as it grows: the same light job on 2, 8, 32 and 64 nodes of
a local cluster of the bench's own, kit against a bare `sbatch` + `srun` of the same command,
measured side by side in one run.

    python bench/bench_scale.py [--nodes 2,8,32,64] [--restarts 4] [--repeat 5] [--quick]

--quick: 2 and 4 nodes, no restarts, one start per kind, no job without the exporter (the suite's
run: the bench keeps working).

The command (one task per node) writes its start time, reports progress through
kit.train.progress once a second for --seconds, declares its work finished and writes its end
time. Per N it prints:

- submit -> every rank running: from just before `kit launch` (or `sbatch`) to the last
  rank's first line, the median of --repeat (5) starts per kind, alternated (kit, bare srun, kit
  without the exporter); and the growth per node from the smallest N >= 8 to the largest, kit's
  against bare srun's (target: kit's <= bare's + 16 ms per node, the exporter included);
- teardown: the last rank's end -> the run's end (prelaunch's record after srun returned;
  bare: the batch script's line after srun) (target: <= 2 s at 64);
- the hang watchdog's reads of the progress directory per minute, counted with strace on the
  batch step (target: <= 1 per rank per poll, no directory listing);
- the exporter targets Prometheus has for the job (one per node, all up);
- `kit ps`, `kit logs` and `kit report` wall time on the job; with --restarts R (the largest N only), on a
  job of R restarts (target: kit ps <= 0.5 s at 64 nodes with 4 restarts);
- peak memory of kit's own processes per node (launcher, sidecars, exporter, prelaunch on the
  batch node; each process's high-water mark, summed): median and largest node.

The cluster lives under a KIT_HOME of the bench's own (a temporary directory, or --kit-home)
and is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import thread_cpu_seconds, wait_for  # noqa: E402

from kit.cluster import LocalCluster  # noqa: E402
from kit.jobdir import JobDir  # noqa: E402

HANG_TIMEOUT = 60  # seconds: the watchdog polls every second below 120 s (KIT_WATCH_EVERY)

TRACED = 5.0  # seconds of the batch step's file operations counted

# The light command: start and end stamps in OUT; progress through kit.train.progress; on the
# warning signal (restarts), a checkpoint of the run's number and a clean stop.
COMMAND = """
import os, signal, sys, time
out, seconds = sys.argv[1], float(sys.argv[2])
rank, restart = os.environ.get("SLURM_PROCID", "0"), int(os.environ.get("KIT_RESTART", "0"))
def stamp(kind):
    with open(f"{out}/.{kind}-{rank}", "w") as f:
        f.write(repr(time.time()))
    os.replace(f"{out}/.{kind}-{rank}", f"{out}/{kind}-{rank}.r{restart}")
stamp("start")
from kit.train import progress
stop = []
signal.signal(signal.SIGUSR1, lambda *a: stop.append(1))
for i in range(int(seconds)):
    progress.step(i + 1)
    print(f"rank {rank} step {i + 1}", flush=True)
    if stop:
        if rank == "0":
            progress.checkpoint_saved(restart + 1)
        sys.exit(0)
    time.sleep(1)
while os.path.exists(f"{out}/hold"):  # the bench is still looking at the running job (its Prometheus targets)
    progress.step(int(seconds))  # alive, for the hang watchdog
    time.sleep(0.5)
progress.finished()
stamp("end")
"""


def stamps(out: Path, kind: str, run: int = 0) -> list[float]:
    return [float(p.read_text()) for p in out.glob(f"{kind}-*.r{run}")]


class Sampler(threading.Thread):
    """Peak RSS of kit's own processes per node while job JOB runs (its environment names
    the job and the node; the command itself and Slurm's daemons are not kit's). Each process's
    own high-water mark (VmHWM), so a sampler started once the start is timed still sees the
    start's peaks, and its scans of every process leave the start's timing alone."""

    def __init__(self, job: str, conf: str):
        super().__init__(daemon=True)
        self.conf = conf
        self.job, self.peak, self.largest, self.done = job, {}, {}, threading.Event()

    def run(self) -> None:
        while True:
            per_node: dict[str, dict[str, int]] = {}
            for proc, env in kit_processes(self.job, self.conf):
                try:
                    what = per_node.setdefault(env.get("SLURMD_NODENAME", "?"), {})
                    words = proc.info["cmdline"] or []
                    name = " ".join(os.path.basename(w) for w in words[:3])[:60] or proc.info["name"]
                    what[name] = what.get(name, 0) + high_water(proc.pid)
                except (psutil.Error, OSError, ValueError):
                    continue
            for node, what in per_node.items():
                total = sum(what.values())
                if total > self.peak.get(node, 0):
                    self.peak[node], self.largest[node] = total, max(what.items(), key=lambda kv: kv[1])
            if self.done.wait(0.5):
                return


def high_water(pid: int) -> int:
    """The most resident memory process PID has held (bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def kit_cli(env: dict, *args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "kit", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    return proc, time.perf_counter() - t0


def kit_processes(job: str, conf: str):
    """(process, its environment) of kit's processes of job JOB: the launchers, their helpers,
    the sidecars; the command and Slurm's own left out."""
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if proc.info["name"] in ("slurmstepd", "slurmd", "srun") or "bench-scale-command" in (
                proc.info["cmdline"] or []
            ):
                continue
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if of_job(env, job, conf):
            yield proc, env


def kit_cpu(job: str, conf: str) -> dict[str, float]:
    """CPU seconds kit's processes have used per node so far (the launchers, their helpers, the
    sidecars; the command and Slurm's daemons left out): what a node spends on kit to start a
    rank. On one machine every node's share runs on the same cores."""
    per_node: dict[str, float] = {}
    for proc, env in kit_processes(job, conf):
        try:
            t = proc.cpu_times()
        except (psutil.Error, OSError):
            continue
        node = env.get("SLURMD_NODENAME", "?")
        own = thread_cpu_seconds(proc.pid) or t.user + t.system
        per_node[node] = per_node.get(node, 0.0) + own + t.children_user + t.children_system
    return per_node


def wait_idle(env: dict, n: int) -> None:
    """Until every node is idle: a job submitted while the last one's nodes are still completing
    waits for Slurm's next scheduling pass, which would be timed as kit's (or srun's) cost."""

    def idle():
        out = subprocess.run(
            ["sinfo", "--noheader", "--Node", "--format=%t"], env=env, capture_output=True, text=True
        ).stdout.split()
        return len(out) == n and set(out) == {"idle"}

    wait_for(idle, 120, poll=0.1)


def of_job(env: dict, job: str, conf: str) -> bool:
    """Whether a process's environment is job JOB's of the bench's cluster (job ids of another
    cluster on this machine may be the same)."""
    return env.get("SLURM_JOB_ID") == job and env.get("SLURM_CONF") == conf


def batch_script(job: str, conf: str) -> psutil.Process | None:
    """The batch script's process (Slurm's copy of it, slurm_script)."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(w.endswith("/slurm_script") for w in proc.info["cmdline"] or []) and of_job(
                proc.environ(), job, conf
            ):
                return proc
        except (psutil.Error, OSError):
            continue
    return None


def started(pid: int) -> float:
    """When process PID started, on time.time()'s clock to a clock tick: /proc/PID/stat's start
    (ticks since boot) on a boot time taken from CLOCK_BOOTTIME (psutil's create_time() rests on
    /proc/stat's btime, a whole second)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return booted + ticks / os.sysconf("SC_CLK_TCK")


def batch_start(job: str, conf: str) -> float:
    """When job JOB's batch script started."""
    return wait_for(lambda: (p := batch_script(job, conf)) and started(p.pid), 300, poll=0.05)


def batch_step_pids(job: str, conf: str) -> list[int]:
    """The batch script and what runs below it."""
    proc = batch_script(job, conf)
    try:
        return [proc.pid] + [c.pid for c in proc.children(recursive=True)] if proc else []
    except psutil.Error:
        return []


def watchdog_reads(job: str, conf: str, progress_dir: Path, seconds: float) -> tuple[int, int, int]:
    """(file operations on the progress directory's entries, listings of it, polls: operations
    on rank 0's progress file) by the batch step over ``seconds``, counted with strace."""
    pids = batch_step_pids(job, conf)
    if not pids:
        return -1, -1, 0
    log = Path(tempfile.mkstemp(prefix="kit-bench-strace-")[1])
    argv = [
        "strace",
        "-f",
        "-qq",
        "-y",
        "-e",
        "trace=openat,open,stat,lstat,newfstatat,statx,access,faccessat2,getdents64",
        "-o",
        str(log),
    ] + [f"-p{p}" for p in pids]
    tracer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    tracer.terminate()
    tracer.wait(10)
    text = log.read_text(errors="replace")
    log.unlink()
    where = str(progress_dir)
    ops = listings = polls = 0
    for line in text.splitlines():
        if where not in line:
            continue
        if "getdents64(" in line:
            listings += 1 if "= 0" not in line else 0
        else:
            ops += 1
            polls += f'{where}/{JobDir.RANK_PROGRESS.format(rank=0)}"' in line
    return ops, listings, polls


def prometheus_targets(port: int, job: str) -> tuple[int, int]:
    """(targets of job JOB Prometheus has, of them up)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets?state=active", timeout=10) as r:
        active = json.load(r)["data"]["activeTargets"]
    mine = [t for t in active if t.get("labels", {}).get("slurm_job_id") == job]
    return len(mine), sum(1 for t in mine if t.get("health") == "up")


def launched(env: dict, n: int, work: Path, seconds: float, name: str, *flags: str, hold: bool = False) -> dict:
    """`kit launch` of the light command on N nodes, timed until every rank runs; ``hold``: its ranks end only
    once ``out/hold`` is removed."""
    out = work / name
    out.mkdir(parents=True)
    if hold:
        (out / "hold").touch()
    wait_idle(env, n)
    t0 = time.time()
    proc, _ = kit_cli(
        env,
        "launch",
        "--local",
        "--json",
        "--nodes",
        str(n),
        "--ntasks-per-node",
        "1",
        "--hang-timeout",
        str(HANG_TIMEOUT),
        "--output-dir",
        str(work / "jobs"),
        *flags,
        "--",
        sys.executable,  # the bench's Python, which has kit (a python3 on PATH may not)
        str(work / "command.py"),
        str(out),
        str(seconds),
        "bench-scale-command",
    )
    if proc.returncode != 0:
        sys.exit(f"kit launch failed:\n{proc.stderr}")
    submitted = json.loads(proc.stdout)
    job, job_dir = str(submitted["job_id"]), JobDir(submitted["job_dir"])
    began = batch_start(job, env["SLURM_CONF"])
    wait_for(lambda: len(stamps(out, "start")) == n, 300, poll=0.05)
    r_cpu = kit_cpu(job, env["SLURM_CONF"])
    sampler = Sampler(job, env["SLURM_CONF"])  # once the start is timed: its scans take CPU the start would
    sampler.start()
    last = max(stamps(out, "start"))
    step_start = float((job_dir.run_progress(0) / JobDir.STEP_START).read_text())
    return {
        "job": job,
        "job_dir": job_dir,
        "out": out,
        "sampler": sampler,
        "scheduled": began - t0,
        "running": last - began,
        "prelaunch": step_start - began,
        "step": last - step_start,
        "cpu": r_cpu,
    }


def started_only(env: dict, n: int, work: Path, seconds: float, name: str, *flags: str) -> float:
    """Batch script -> every rank running of one more kit job (``flags``: e.g. --no-exporter), run to its end."""
    r = launched(env, n, work, seconds, name, *flags)
    runs = r["job_dir"] / JobDir.RUNS
    wait_for(lambda: runs.exists(), 600, poll=0.1)
    r["sampler"].done.set()
    return r["running"]


def whole_job(env: dict, n: int, work: Path, kind: str) -> float:
    """Wall seconds of a `true` job on N nodes, from the command's start to its return: `kit launch --wait`
    (submission, Slurm's scheduling, prelaunch, the launchers and sidecars, the teardown), or a bare
    `srun -N N true`. The measure kit's cost at scale was first found with (best of a few)."""
    wait_idle(env, n)
    if kind == "srun":
        t0 = time.perf_counter()
        proc = subprocess.run(["srun", "-N", str(n), "--ntasks-per-node", "1", "true"], env=env, capture_output=True)
        took = time.perf_counter() - t0
    else:
        proc, took = kit_cli(
            env, "launch", "--local", "--wait", "--nodes", str(n), "--ntasks-per-node", "1", "--output-dir",
            str(work / "jobs"), "--", "true",
        )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"{kind} of a true job failed:\n{proc.stderr}")
    return took


def kit_job(cluster: LocalCluster, env: dict, n: int, work: Path, seconds: float, restarts: int = 0) -> dict:
    r = launched(
        env,
        n,
        work,
        seconds,
        f"kit-{n}-{restarts}",
        *(["--max-restarts", str(restarts)] if restarts else []),
        hold=True,
    )
    job, job_dir, out, sampler = r["job"], r["job_dir"], r["out"], r["sampler"]
    r["reads"] = watchdog_reads(job, env["SLURM_CONF"], job_dir.run_progress(0), TRACED)
    port = cluster.state().prometheus_port
    try:  # the job runs on until this is seen (a short --quick job could end before Prometheus's first scrape)
        r["targets"] = wait_for(lambda: (t := prometheus_targets(port, job))[1] == n and t, 30, poll=1)
    except TimeoutError:
        r["targets"] = prometheus_targets(port, job)
    (out / "hold").unlink()
    for i in range(restarts):  # the warning, as Slurm sends it before the time limit
        wait_for(lambda: len(stamps(out, "start", i)) == n, 300, poll=0.2)
        time.sleep(2)
        subprocess.run(["scancel", "--batch", "--signal=USR1", job], env=env, check=True)
        wait_for(lambda: len(stamps(out, "start", i + 1)) == n, 300, poll=0.2)
    runs = job_dir / JobDir.RUNS
    wait_for(
        lambda: (
            len(stamps(out, "end", restarts)) == n
            and runs.exists()
            and len(runs.read_text().splitlines()) == restarts + 1
        ),
        600,
        poll=0.1,
    )
    sampler.done.set()
    sampler.join()
    last_end = max(stamps(out, "end", restarts))
    r["teardown"] = runs.stat().st_mtime - last_end
    # The exit records (each launcher's last act, "time(ns) rank rc how") split it: the
    # launchers' own teardown, then srun's return and prelaunch's conclusion.
    launchers_done = max(int(p.read_text().split()[0]) / 1e9 for p in job_dir.exit_records(restarts))
    r["launchers"], r["after_step"] = launchers_done - last_end, runs.stat().st_mtime - launchers_done
    r["memory"], r["largest"] = sampler.peak, sampler.largest
    _, r["ps"] = kit_cli(env, "ps", "--output-dir", str(work / "jobs"))
    logs, r["logs"] = kit_cli(env, "logs", str(job_dir.path))
    r["log_lines"] = len(logs.stdout.splitlines())
    rep, r["report"] = kit_cli(env, "report", str(job_dir.path), timeout=600)
    if rep.returncode != 0:
        sys.exit(f"kit report failed:\n{rep.stderr}")
    r["report_lines"] = len(rep.stdout.splitlines())
    return r


def bare_job(env: dict, n: int, work: Path, seconds: float, name: str = "") -> dict:
    out = work / (name or f"bare-{n}")
    out.mkdir(parents=True)
    script = (
        f"#!/bin/bash\nsrun {sys.executable} {work / 'command.py'} {out} {seconds} bench-scale-command\n"
        f"{sys.executable} -c 'import time; print(repr(time.time()))' > {out}/srun-returned\n"
    )
    wait_idle(env, n)
    t0 = time.time()
    job = (
        subprocess.run(
            ["sbatch", "--parsable", "-N", str(n), "--ntasks-per-node", "1", f"--output={out}/slurm.out"],
            input=script,
            text=True,
            env=env,
            check=True,
            capture_output=True,
        )
        .stdout.split(";")[0]
        .strip()
    )
    began = batch_start(job, env["SLURM_CONF"])
    wait_for(lambda: len(stamps(out, "start")) == n, 300, poll=0.05)
    running = max(stamps(out, "start")) - began
    wait_for(lambda: (out / "srun-returned").exists() and (out / "srun-returned").read_text().strip(), 300, poll=0.1)
    return {
        "scheduled": began - t0,
        "running": running,
        "teardown": float((out / "srun-returned").read_text()) - max(stamps(out, "end")),
    }


def without(r: dict) -> str:
    return "" if r["no_exporter"] != r["no_exporter"] else f" (without the exporter {r['no_exporter']:.2f} s)"


def cpu_ms(r: dict) -> str:
    return f"{statistics.median(r['cpu'].values()) * 1000:.0f}" if r["cpu"] else "-"


def biggest(r: dict) -> str:
    """The node whose kit processes peaked highest, and its largest process."""
    if not r["memory"]:
        return "-"
    node = max(r["memory"], key=r["memory"].get)
    name, rss = r["largest"][node]
    return f"{mib(r['memory'][node])} on {node} ({name}: {mib(rss)})"


def mib(b: float) -> str:
    return f"{b / 2**20:.0f} MiB"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="2,8,32,64")
    p.add_argument("--restarts", type=int, default=4, help="restarts of a second job at the largest N")
    p.add_argument("--seconds", type=float, default=20.0, help="how long each rank runs")
    p.add_argument("--repeat", type=int, default=5, help="starts timed per size and kind (medians)")
    p.add_argument("--kit-home", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="keep the jobs' directories (their reports) and say where")
    p.add_argument(
        "--quick", action="store_true", help="2 and 4 nodes, no restarts, no job without the exporter (the suite's run)"
    )
    args = p.parse_args()
    if args.quick:  # the kit job outlasts the watchdog's trace; the bare job's length is not measured
        global TRACED
        args.nodes, args.restarts, args.seconds, args.repeat, TRACED = "2,4", 0, 5.0, 1, 3.0
    sizes = [int(x) for x in args.nodes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="kit-bench-scale-"))
    home = args.kit_home or work / "home"
    (work / "command.py").write_text(COMMAND)
    env = {**os.environ, "KIT_HOME": str(home)}
    cluster = LocalCluster(home)
    rows = {}
    try:
        for n in sizes:
            if cluster.state() is not None:
                cluster.down(force=True)
            t0 = time.perf_counter()
            cluster.up(nodes=n, cpus_per_node=1, prometheus=True, accounting=False)
            up = time.perf_counter() - t0
            env["SLURM_CONF"] = str(cluster.conf)
            # every node answered once before anything is timed (a first step pays for the nodes' start)
            subprocess.run(["srun", "-N", str(n), "--ntasks-per-node", "1", "true"], env=env, check=True, timeout=300)
            bare = bare_job(env, n, work, 1.0 if args.quick else args.seconds)
            mine = kit_job(cluster, env, n, work, args.seconds)
            starts = {"bare": [bare["running"]], "kit": [mine["running"]], "lean": []}
            for i in range(args.repeat):  # the start again, alternated: medians, not one draw of a shared machine
                if i:
                    starts["bare"].append(bare_job(env, n, work, 1.0, f"bare-{n}-{i}")["running"])
                    starts["kit"].append(started_only(env, n, work, 1.0, f"kit-{n}-again-{i}"))
                if not args.quick:
                    starts["lean"].append(started_only(env, n, work, 1.0, f"kit-{n}-lean-{i}", "--no-exporter"))
            bare["running"], mine["running"] = statistics.median(starts["bare"]), statistics.median(starts["kit"])
            mine["no_exporter"] = statistics.median(starts["lean"]) if starts["lean"] else float("nan")
            mine["starts"] = starts
            rows[n] = (up, mine, bare)
            draws = "; ".join(f"{k} " + " ".join(f"{x:.2f}" for x in v) for k, v in starts.items() if v)
            print(f"{n:>3} nodes, batch script -> all running, each start (s; lean: without the exporter): {draws}")
            whole: dict[str, list[float]] = {"kit": [], "srun": []}
            for _ in range(args.repeat):  # alternated
                for kind, took in whole.items():
                    took.append(whole_job(env, n, work, kind))
            mine["whole"], bare["whole"] = min(whole["kit"]), min(whole["srun"])
            print(
                f"{n:>3} nodes, a `true` job, command -> its return (best of {args.repeat}): kit launch --wait "
                f"{mine['whole']:.2f} s, srun {bare['whole']:.2f} s"
            )
            mem = sorted(mine["memory"].values())
            ops, listings, polls = mine["reads"]
            per_rank = ops / max(polls, 1) / n
            print(
                f"{n:>3} nodes: up {up:.1f} s; submit -> batch script: kit {mine['scheduled']:.2f} s, bare "
                f"{bare['scheduled']:.2f} s (Slurm's scheduling); batch script -> all running (median): kit "
                f"{mine['running']:.2f} s{without(mine)}, bare srun "
                f"{bare['running']:.2f} s (kit's CPU per node by then: "
                f"median {cpu_ms(mine)} ms); teardown: kit {mine['teardown']:.2f} s (launchers "
                f"{mine['launchers']:.2f} s, then srun's return and prelaunch {mine['after_step']:.2f} s), bare "
                f"{bare['teardown']:.2f} s; "
                f"watchdog: {ops * 60 / TRACED:.0f} progress-file operations a minute ({per_rank:.2f} per rank per "
                f"poll, {polls} polls), {listings} directory listing(s); Prometheus targets {mine['targets'][1]}/{n} up; kit ps "
                f"{mine['ps']:.2f} s, kit logs {mine['logs']:.2f} s ({mine['log_lines']} lines), kit report {mine['report']:.2f} s ({mine['report_lines']} lines); kit's "
                f"memory per node: median {mib(statistics.median(mem)) if mem else '-'}, largest "
                f"{biggest(mine)}",
                flush=True,
            )
        if args.restarts:
            n = sizes[-1]
            again = kit_job(cluster, env, n, work, args.seconds, restarts=args.restarts)
            print(
                f"{n:>3} nodes, {args.restarts} restarts: kit ps {again['ps']:.2f} s (target <= 0.5 s: "
                f"{'met' if again['ps'] <= 0.5 else 'MISSED'}), kit logs {again['logs']:.2f} s, "
                f"kit report {again['report']:.2f} s ({again['report_lines']} lines)"
            )
        grown = [n for n in sizes if n >= 8] or sizes
        lo, hi = grown[0], sizes[-1]
        if hi > lo:
            kit_slope = (rows[hi][1]["running"] - rows[lo][1]["running"]) / (hi - lo)
            bare_slope = (rows[hi][2]["running"] - rows[lo][2]["running"]) / (hi - lo)
            extra = (kit_slope - bare_slope) * 1000
            slope = {part: (rows[hi][1][part] - rows[lo][1][part]) / (hi - lo) * 1000 for part in ("prelaunch", "step")}
            if not args.quick:
                lean = (rows[hi][1]["no_exporter"] - rows[lo][1]["no_exporter"]) / (hi - lo) * 1000 - bare_slope * 1000
                print(
                    f"batch script -> all running, {lo} -> {hi} nodes, without the exporter sidecar: kit's own "
                    f"growth {lean:+.1f} ms per node beyond bare srun's"
                )
            whole = [(rows[hi][i]["whole"] - rows[lo][i]["whole"]) / (hi - lo) * 1000 for i in (1, 2)]
            print(
                f"a `true` job, command -> its return, {lo} -> {hi} nodes (best of {args.repeat}): kit launch --wait "
                f"{whole[0]:+.1f} ms per node, srun {whole[1]:+.1f}: kit's own {whole[0] - whole[1]:+.1f} ms per node "
                "(Slurm's scheduling, a second or two a job, is most of either)"
            )
            print(
                f"batch script -> all running, {lo} -> {hi} nodes: kit {kit_slope * 1000:+.1f} ms per node "
                f"(prelaunch before srun {slope['prelaunch']:+.1f}, srun -> every launcher's command "
                f"{slope['step']:+.1f}), bare srun {bare_slope * 1000:+.1f} ms per node: kit's own growth "
                f"{extra:+.1f} ms per node (target <= 16): {'met' if extra <= 16 else 'MISSED'}"
            )
            tear = {
                part: (rows[hi][1][part] - rows[lo][1][part]) / (hi - lo) * 1000 for part in ("launchers", "after_step")
            }
            print(
                f"teardown at {hi} nodes: {rows[hi][1]['teardown']:.2f} s (target <= 2 s): "
                f"{'met' if rows[hi][1]['teardown'] <= 2 else 'MISSED'}; from {lo} nodes it grows "
                f"{tear['launchers']:+.1f} ms per node in the launchers' teardown, {tear['after_step']:+.1f} in "
                f"srun's return and prelaunch's conclusion"
            )
            cpu = statistics.median(rows[hi][1]["cpu"].values()) if rows[hi][1]["cpu"] else 0.0
            print(
                f"kit's CPU per node to start a rank: {cpu * 1000:.0f} ms; {hi} nodes on this machine's "
                f"{os.cpu_count()} cores: {cpu * hi / (os.cpu_count() or 1):.1f} s of the start that separate "
                f"nodes spend in parallel"
            )
        print(
            f"the {sizes[-1]}-node job's report: {rows[sizes[-1]][1]['job_dir'].path / JobDir.REPORT}"
            if args.keep
            else ""
        )
    finally:
        if cluster.state() is not None:
            cluster.down(force=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
