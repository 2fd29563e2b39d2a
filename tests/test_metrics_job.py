"""Metrics of real jobs: a real Prometheus finds both
nodes' exporters through file_sd during a 2-node job; nothing is left afterwards;
killing an exporter never stops the training."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import sys
import threading
import urllib.parse
import urllib.request
from pathlib import Path

from helpers import job_processes, kit, read_logs, submit, wait_for, wait_no_processes

from kit import slurm

TRAIN = [sys.executable, "-m", "kit.train"]
OWN_PORTS = "19700-19719"  # no other test's range


def query(cluster, promql: str) -> list:
    url = cluster.prometheus_url() + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]["result"]


def exporters(job_dir) -> list[int]:
    return [pid for pid, cmd in job_processes(job_dir) if "kit.monitor" in cmd]


def test_prometheus_discovers_both_exporters_during_a_two_node_job(cluster, tmp_path):
    # Ports of its own: beside this test another worker's jobs take the first free port of the default range, the
    # one this job's exporter has just given back (CI: "Address already in use" below).
    job = submit(
        tmp_path,
        "--nodes",
        "2",
        "--exporter-ports",
        OWN_PORTS,
        command=[*TRAIN, "--max-steps", "400", "--step-delay", "0.05", "--log-every", "50"],
    )
    job_id, job_dir = job["job_id"], job["job_dir"]
    targets_dir = cluster.prometheus_targets

    def target_files():
        return sorted(targets_dir.glob(f"root/kit-{job_id}-*.json"))  # root's own directory: root's job

    files = wait_for(lambda: len(target_files()) == 2 and target_files(), 60, what="both target files")
    ports = []
    for f in files:
        (entry,) = json.loads(f.read_text())
        assert entry["labels"]["slurm_job_id"] == job_id and "job" not in entry["labels"]
        ports.append(int(entry["targets"][0].rsplit(":", 1)[1]))
    assert all(19700 <= p <= 19719 for p in ports), ports
    sel = f'{{slurm_job_id="{job_id}"}}'
    node_series = wait_for(
        lambda: (r := query(cluster, f"node_load1{sel}")) and len(r) == 2 and r,
        60,
        what="node series of both nodes in Prometheus",
    )
    assert sorted(s["metric"]["node"] for s in node_series) == ["node1", "node2"]
    # Served as node_memory_mem_available_bytes (promtool-clean), stored under
    # node_exporter's name by the scrape config's metric_relabel_configs.
    memory = query(cluster, f"node_memory_MemAvailable_bytes{sel}")
    assert sorted(s["metric"]["node"] for s in memory) == ["node1", "node2"]
    assert query(cluster, f"node_memory_mem_available_bytes{sel}") == []
    training = wait_for(
        lambda: (r := query(cluster, f"training_step{sel}")) and len(r) == 2 and r,
        60,
        what="training series of both ranks in Prometheus",
    )
    assert sorted(s["metric"]["rank"] for s in training) == ["0", "1"]
    assert all(s["metric"]["slurm_job_name"] == "kit" and s["metric"]["job"] == "kit" for s in training)
    gpu_up = query(cluster, f'kit_exporter_collector_success{{collector="gpu",slurm_job_id="{job_id}"}}')
    assert [s["value"][1] for s in gpu_up] == ["0", "0"]  # no GPU here: the GPU collector says it is down

    end = slurm.wait(cluster.target, job_id, timeout=180)
    assert end.state == "COMPLETED", read_logs(job_dir)
    assert wait_for(lambda: not target_files(), 10, what="target files to go") is True
    assert wait_no_processes(job_dir, 5) == []
    for port in ports:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.close()
    logs = sorted(Path(job_dir, "logs").glob("*.metrics.jsonl"))
    assert [p.name for p in logs] == ["node1.r0.metrics.jsonl", "node2.r0.metrics.jsonl"]
    check_report(cluster, job_dir, logs)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def check_report(cluster, job_dir: str, logs: list[Path]) -> None:
    """kit report on a CPU job draws
    the CPU, memory, loss, step time, model TFLOP/s and throughput panels and no empty one (no MFU on a CPU); every
    number of its summary is computed again here from the JSONL logs."""
    from helpers import kit
    from report_check import check

    out = Path(job_dir) / "from-logs.png"
    proc = kit("report", job_dir, "-o", str(out), "--prometheus", "http://127.0.0.1:1")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["panels"] == [
        "CPU (cores busy)",
        "Memory (GiB)",
        "Training loss",
        "Step time (s)",
        "Model TFLOP/s per device",
        "Training throughput (samples/s)",
    ]  # no MFU on a CPU
    assert summary["tflops"] > 0 and summary["mfu"] is None
    assert png_size(out)[0] == 1040 and out.stat().st_size > 40_000  # 13 in at 80 dpi: legends beside the panels
    assert summary["source"] == "metrics logs (Prometheus unreachable)"
    want = check(Path(job_dir), summary, proc.stdout)
    assert want["samples"] > 0 and "GPUs: no GPU samples" in proc.stdout
    for node in ("node1", "node2"):  # the job's own processes were found on both nodes
        n = want["nodes"][node]
        assert n["cpu_cores_used"] > 0 and n["memory_peak_bytes"] > 50 * 2**20 and n["cpus_allocated"] >= 1
    assert "utilisation notes need 300 s of samples" in proc.stdout  # a short job: no verdict on it
    live = kit("report", job_dir, "-o", str(Path(job_dir) / "from-prometheus.png"))
    assert live.returncode == 0, live.stderr
    assert f"(data: Prometheus {cluster.prometheus_url()})" in live.stdout
    from_prometheus = json.loads((Path(job_dir) / "from-prometheus.json").read_text())
    assert from_prometheus["panels"] == summary["panels"]


def test_killing_the_exporter_leaves_the_training_running(cluster, tmp_path):
    """Each node's exporter yields the CPU to the training. A node's exporter killed mid-run: the training runs
    on; and that node, whose samples stop with its exporter, is said to have lost it (kit report, kit events,
    kit ps), never called "a slow node" (it was, 2 of 2)."""
    job = submit(tmp_path, "--nodes", "2", command=[*TRAIN, "--max-steps", "400", "--step-delay", "0.05"])
    job_dir = job["job_dir"]
    pids = wait_for(lambda: len(exporters(job_dir)) == 2 and exporters(job_dir), 60, what="both exporters")
    wait_for(lambda: "step=" in read_logs(job_dir), 60, what="the training to step")
    if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
        # Each exporter yields the CPU to the training: nice 19, in a scheduling group of its own niced too.
        assert [Path(f"/proc/{pid}/autogroup").read_text().split()[-2:] for pid in pids] == [["nice", "10"]] * 2
    environ = Path(f"/proc/{pids[0]}/environ").read_bytes().split(b"\0")
    node = next(kv.split(b"=", 1)[1].decode() for kv in environ if kv.startswith(b"SLURMD_NODENAME="))
    os.kill(pids[0], signal.SIGKILL)
    end = slurm.wait(cluster.target, job["job_id"], timeout=180)
    assert (end.state, end.exit_code) == ("COMPLETED", 0), read_logs(job_dir)
    assert "done at step=400" in read_logs(job_dir)
    assert wait_no_processes(job_dir, 5) == []
    report = kit("report", job_dir, "-o", str(tmp_path / "report.png"))
    assert report.returncode == 0 and f"{node}'s exporter stopped" in report.stdout, report.stdout + report.stderr
    assert "a slow node" not in report.stdout, report.stdout
    events = kit("events", job_dir).stdout
    assert f"{node}'s exporter stopped" in events, events
    rows = json.loads(kit("ps", "--json", "--all", "--output-dir", str(Path(job_dir).parent)).stdout)
    [row] = [r for r in rows if Path(r["job_dir"]).resolve() == Path(job_dir).resolve()]
    assert row["exporters_lost"] == [node], row


GPU_RANK = (
    'echo "rank=$RANK local=$LOCAL_RANK cvd=${CUDA_VISIBLE_DEVICES-unset} step=${SLURM_STEP_GPUS-unset} '
    'node=$SLURMD_NODENAME"; echo $$ > "$KIT_JOB_DIR/pid-$RANK"; '
    'exec python3 -c "import time; from kit.train import progress\n'
    "for i in range(1, 10**6):\n    progress.step(i)\n    time.sleep(0.2)\n    "
    "import os\n    if os.path.exists(os.environ['KIT_JOB_DIR'] + '/stop'): break\""
)


def test_a_two_node_two_gpu_job_through_the_real_nvml_binding(cluster, tmp_path):
    """2 nodes x 2 GPUs on the local cluster, the
    exporters reading the test NVML library through nvidia-ml-py. One rank per GPU as Slurm
    binds them; the series carry the job's ids for exactly its GPUs (each node's NVML shows 4,
    Slurm gave the job 2); gpu_compute_processes counts the ranks' pids the library reports;
    kit report draws the GPU panels and flags the GPU held with no process; an injected Xid
    fires KitGpuXidError in the real Prometheus."""
    from fake_gpus import FakeGpus
    from helpers import kit
    from report_check import check

    fleet = {node: FakeGpus(tmp_path / f"nvml-{node}", minors=[0, 1, 2, 3]) for node in ("node1", "node2")}
    for gpus in fleet.values():
        for minor in (0, 1, 2, 3):
            gpus.set(minor, util=99 if minor > 1 else 0).processes(minor, [4242] if minor > 1 else [])
        gpus.write()
    env = fleet["node1"].env()
    job = submit(
        tmp_path,
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--ntasks-per-node",
        "2",
        "--env",
        f"LD_LIBRARY_PATH={env['LD_LIBRARY_PATH']}",
        "--env",
        f"FAKE_NVML_STATE={tmp_path}/nvml-{{node}}",
        command=["bash", "-c", GPU_RANK],
    )
    job_id, job_dir = job["job_id"], Path(job["job_dir"])
    pids = wait_for(
        lambda: (
            len(list(job_dir.glob("pid-*"))) == 4
            and {int(p.name[4:]): int(p.read_text()) for p in job_dir.glob("pid-*") if p.read_text().strip()}
        ),
        90,
        what="all four ranks",
    )
    lines = wait_for(
        lambda: len(r := re.findall(r"^\d: (rank=.*)$", read_logs(job_dir), re.M)) == 4 and r,
        30,
        what="the ranks' lines",
    )
    ranks = {int(re.search(r"rank=(\d+)", x).group(1)): dict(w.split("=", 1) for w in x.split()) for x in lines}
    for node in ("node1", "node2"):
        mine = [r for r in ranks.values() if r["node"] == node]
        assert sorted(r["local"] for r in mine) == ["0", "1"], ranks
        assert all(r["cvd"] == r["step"] == "0,1" for r in mine), ranks  # Slurm's binding: both GPUs, one per rank
        assert sorted(r["cvd"].split(",")[int(r["local"])] for r in mine) == ["0", "1"]  # each rank its own GPU
    # Node1's GPU 1 is held with no process; the others run the ranks (their pids, as NVML gives them).
    node_of = {rank: r["node"] for rank, r in ranks.items()}
    for node, gpus in fleet.items():
        local = sorted(rank for rank, n in node_of.items() if n == node)
        for minor, rank in enumerate(local):
            busy = not (node == "node1" and minor == 1)
            gpus.set(minor, util=80 if busy else 0).processes(minor, [pids[rank]] if busy else [])
        gpus.write()

    sel = f'{{slurm_job_id="{job_id}"}}'

    def series(metric):
        return {(s["metric"]["node"], s["metric"]["gpu"]): float(s["value"][1]) for s in query(cluster, metric + sel)}

    want = {("node1", "0"), ("node1", "1"), ("node2", "0"), ("node2", "1")}
    wait_for(
        lambda: (
            set(series("DCGM_FI_DEV_GPU_UTIL")) == want and series("gpu_compute_processes").get(("node1", "0")) == 1
        ),
        60,
        what="the job's 4 GPUs in Prometheus, with the ranks' processes",
    )
    assert series("gpu_compute_processes") == {
        ("node1", "0"): 1,
        ("node1", "1"): 0,
        ("node2", "0"): 1,
        ("node2", "1"): 1,
    }
    assert set(series("DCGM_FI_DEV_POWER_USAGE")) == want and set(series("gpu_lost")) == want

    def firing(name):
        return query(cluster, f'ALERTS{{alertname="{name}",alertstate="firing",slurm_job_id="{job_id}"}}')

    # An Xid on node2's GPU 0 (once node2's exporter watches for them): the alert fires in Prometheus.
    exporter_log = Path(job_dir) / "logs" / "node2.r0.exporter.log"
    wait_for(
        lambda: exporter_log.exists() and "watching XID events on 2 GPU(s)" in exporter_log.read_text(),
        60,
        what="node2's exporter to watch for XID events",
    )
    fleet["node2"].xid(0, 79)
    alert = wait_for(lambda: firing("KitGpuXidError"), 60, what="KitGpuXidError to fire")
    assert {(a["metric"]["node"], a["metric"]["gpu"]) for a in alert} == {("node2", "0")}, alert
    assert series("DCGM_FI_DEV_XID_ERRORS")[("node2", "0")] == 79
    # Uncorrectable remapped rows on node1's GPU 0, node2's GPU 1 lost: their alerts fire too.
    fleet["node1"].set(0, remap_unc=2).write()
    fleet["node2"].lose(1).write()
    for name, where in (("KitGpuEccErrors", ("node1", "0")), ("KitGpuLost", ("node2", "1"))):
        fired = wait_for(lambda: firing(name), 60, what=f"{name} to fire")
        assert {(a["metric"]["node"], a["metric"]["gpu"]) for a in fired} == {where}, fired
    fleet["node2"].lost.clear()
    fleet["node2"].write()

    # node2's GPU 1 back: the job's metrics see it before the job ends.
    wait_for(lambda: series("gpu_lost").get(("node2", "1")) == 0, 60, what="node2's GPU 1 back in Prometheus")
    (job_dir / "stop").write_text("")
    end = slurm.wait(cluster.target, job_id, timeout=120)
    assert (end.state, end.exit_code) == ("COMPLETED", 0), read_logs(job_dir)
    proc = kit("report", str(job_dir), "--min-seconds", "0", "--prometheus", "http://127.0.0.1:1")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((job_dir / "report.json").read_text())
    check(job_dir, summary, proc.stdout)
    assert summary["panels"][:3] == ["GPU utilization (%)", "GPU memory used (MiB)", "GPU power (W)"]
    notes = [n for n in proc.stdout.split("notes:\n", 1)[1].splitlines() if n.startswith("  ")]
    assert any(n.startswith("  ALERT: node1 gpu1: held with no process on it in ") for n in notes), proc.stdout
    assert not any("gpu0: held" in n or "node2 gpu1: held" in n for n in notes), proc.stdout


def test_a_finished_job_tells_the_same_throughput_and_duration_everywhere(cluster, tmp_path):
    """one finished 2-node job's throughput and duration (kit.jobdir.tally) are the same at the end
    of --wait, in kit ps, kit report's text and report.json, kit events and kit ui; its samples are what the trainer
    counts (64 a step per rank, a run's first step init's), its nodes' rates add up to the job's, and the live rate
    seen while it trained is of the same size."""
    from helpers import kit

    from kit.ui import server

    steps, jobs = 150, tmp_path / "jobs"
    live = []

    def watch():  # kit ps while the job trains: its ranks' latest rate, summed
        while not stop.is_set():
            rows = json.loads(kit("ps", "--json", "--output-dir", str(jobs)).stdout or "[]")
            mine = [r for r in rows if r["job_dir"].startswith(str(jobs)) and r["state"] == "RUNNING"]
            live.extend(r["samples_per_second"] for r in mine if r["samples_per_second"])
            stop.wait(1)

    stop = threading.Event()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        done = kit(
            "launch", "--local", "--wait", "--nodes", "2", "--output-dir", str(jobs), "--",
            *TRAIN, "--max-steps", str(steps), "--step-delay", "0.05", "--log-every", "1000",
        )  # fmt: skip
    finally:
        stop.set()
        watcher.join()
    assert done.returncode == 0, done.stderr
    job_dir = re.search(r"^job dir: (.+)$", done.stdout, re.M).group(1)
    job_id = Path(job_dir, "job_id").read_text().strip()
    said = re.search(
        rf"^kit: job {job_id}: ([0-9.]+) samples/s \(([0-9]+) samples in ([0-9.]+) s of steps\); "
        rf"([0-9.]+) s from submission to its end$",
        done.stderr,
        re.M,
    )
    assert said, done.stderr
    words = said.group(0).split(f"job {job_id}: ", 1)[1]
    rate, samples, wall = float(said.group(1)), int(said.group(2)), float(said.group(4))
    assert samples == 2 * 64 * (steps - 1)
    # kit ps
    (row,) = [r for r in json.loads(kit("ps", "--json", "--output-dir", str(jobs)).stdout) if r["id"] == job_id]
    assert (round(row["samples_per_second"], 1), round(row["duration_seconds"], 1)) == (rate, wall), row
    # kit report: text and report.json
    rep = kit("report", job_dir, "-o", str(tmp_path / "r.png"), "--prometheus", "http://127.0.0.1:1")
    assert rep.returncode == 0, rep.stderr
    numbers = json.loads((tmp_path / "r.json").read_text())
    assert numbers["samples"] == samples and numbers["samples_per_second"] == row["samples_per_second"]
    assert numbers["duration_seconds"] == row["duration_seconds"]
    assert f"samples: {samples} ({rate:.1f} samples/s over {said.group(3)} s of steps)" in rep.stdout, rep.stdout
    assert f"duration: {wall:.1f} s from submission to its end" in rep.stdout, rep.stdout
    nodes = [n["samples_per_second"] for n in numbers["nodes"]]
    assert len(nodes) == 2 and abs(sum(nodes) - numbers["samples_per_second"]) < 1e-6 * rate
    # kit events, and what --notify would send at the end
    ended = [e for e in json.loads(kit("events", "--json", job_dir).stdout) if e["kind"] == "ended"]
    assert len(ended) == 1 and ended[0]["text"].endswith(f": {words}"), ended
    # kit ui: the job's page and its API
    ui = server.Ui((str(jobs),))
    status, _, page = ui.answer(f"/job/{job_id}", {})
    assert (
        status == 200 and f"{rate:.1f} (the job's" in page.decode() and f"{wall:.1f} s from submission" in page.decode()
    )
    status, _, api = ui.answer(f"/api/job/{job_id}", {})
    assert json.loads(api)["row"]["samples_per_second"] == row["samples_per_second"]
    # While it trained, kit ps said its ranks' latest rate: the same size as the job's (not a per-node or a
    # whole-wall-time figure, half or a third of it).
    assert live and 0.5 * rate < statistics.median(live) < 2 * rate, (live, rate)
