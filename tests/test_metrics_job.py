"""Metrics of real jobs (issue 4, done-means 1 and 4): a real Prometheus finds both
nodes' exporters through file_sd during a 2-node job; nothing is left afterwards;
killing an exporter never stops the training."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import urllib.parse
import urllib.request
from pathlib import Path

from helpers import job_processes, read_logs, submit, wait_for, wait_no_processes

from kit import slurm

TRAIN = [sys.executable, "-m", "kit.train"]


def query(cluster, promql: str) -> list:
    url = cluster.prometheus_url() + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]["result"]


def exporters(job_dir) -> list[int]:
    return [pid for pid, cmd in job_processes(job_dir) if "kit.monitor" in cmd]


def test_prometheus_discovers_both_exporters_during_a_two_node_job(cluster, tmp_path):
    job = submit(tmp_path, "--nodes", "2",
                 command=[*TRAIN, "--max-steps", "400", "--step-delay", "0.05", "--log-every", "50"])
    job_id, job_dir = job["job_id"], job["job_dir"]
    targets_dir = cluster.prometheus_targets

    def target_files():
        return sorted(targets_dir.glob(f"kit-{job_id}-*.json"))

    files = wait_for(lambda: len(target_files()) == 2 and target_files(), 60, what="both target files")
    ports = []
    for f in files:
        (entry,) = json.loads(f.read_text())
        assert entry["labels"]["slurm_job_id"] == job_id and "job" not in entry["labels"]
        ports.append(int(entry["targets"][0].rsplit(":", 1)[1]))
    sel = f'{{slurm_job_id="{job_id}"}}'
    node_series = wait_for(lambda: (r := query(cluster, f"node_load1{sel}")) and len(r) == 2 and r, 60,
                           what="node series of both nodes in Prometheus")
    assert sorted(s["metric"]["node"] for s in node_series) == ["node1", "node2"]
    # Served as node_memory_mem_available_bytes (promtool-clean), stored under
    # node_exporter's name by the scrape config's metric_relabel_configs.
    memory = query(cluster, f"node_memory_MemAvailable_bytes{sel}")
    assert sorted(s["metric"]["node"] for s in memory) == ["node1", "node2"]
    assert query(cluster, f"node_memory_mem_available_bytes{sel}") == []
    training = wait_for(lambda: (r := query(cluster, f"training_step{sel}")) and len(r) == 2 and r, 60,
                        what="training series of both ranks in Prometheus")
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
    """Issue 4 done-means 5 and issue 11 done-means 5: kit report on a CPU job draws
    the CPU, memory, loss, step time and throughput panels and no empty one; every
    number of its summary is computed again here from the JSONL logs."""
    from helpers import kit
    from report_check import check

    out = Path(job_dir) / "from-logs.png"
    proc = kit("report", job_dir, "-o", str(out), "--prometheus", "http://127.0.0.1:1")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["panels"] == ["CPU (cores busy)", "Memory (GiB)", "Training loss", "Step time (s)",
                                 "Training throughput (samples/s)"]
    assert png_size(out)[0] == 800 and out.stat().st_size > 40_000
    assert summary["source"] == "metrics logs (Prometheus unreachable)"
    want = check(Path(job_dir), summary, proc.stdout)
    assert want["samples"] > 0 and "GPUs: no GPU samples" in proc.stdout
    for node in ("node1", "node2"):  # the job's own processes were found on both nodes
        n = want["nodes"][node]
        assert n["cpu_cores_used"] > 0 and n["memory_peak_bytes"] > 50 * 2 ** 20 and n["cpus_allocated"] >= 1
    assert "utilisation notes need 300 s of samples" in proc.stdout  # a short job: no verdict on it
    live = kit("report", job_dir, "-o", str(Path(job_dir) / "from-prometheus.png"))
    assert live.returncode == 0, live.stderr
    assert f"(data: Prometheus {cluster.prometheus_url()})" in live.stdout
    from_prometheus = json.loads((Path(job_dir) / "from-prometheus.json").read_text())
    assert from_prometheus["panels"] == summary["panels"]


def test_killing_the_exporter_leaves_the_training_running(cluster, tmp_path):
    job = submit(tmp_path, "--nodes", "2", command=[*TRAIN, "--max-steps", "150", "--step-delay", "0.05"])
    job_dir = job["job_dir"]
    pids = wait_for(lambda: len(exporters(job_dir)) == 2 and exporters(job_dir), 60, what="both exporters")
    os.kill(pids[0], signal.SIGKILL)
    end = slurm.wait(cluster.target, job["job_id"], timeout=180)
    assert (end.state, end.exit_code) == ("COMPLETED", 0), read_logs(job_dir)
    assert "done at step=150" in read_logs(job_dir)
    assert wait_no_processes(job_dir, 5) == []


def test_report_flags_an_idle_gpu_held_by_a_job(cluster, tmp_path):
    """Issue 11 done-means 5: a node whose exporter sees two (fake-NVML) GPUs, one
    busy with the training's process, one idle with none: the notes flag the idle one."""
    from helpers import REPO, kit
    from report_check import check

    job = submit(tmp_path, "--nodes", "1", "--gpus-per-node", "2",
                 "--env", f"PYTHONPATH={REPO / 'tests' / 'nvml_module'}",
                 "--env", "FAKE_NVML_UTIL=80,0", "--env", "FAKE_NVML_PROCESSES=1,0",
                 command=[*TRAIN, "--max-steps", "100", "--step-delay", "0.05"])
    end = slurm.wait(cluster.target, job["job_id"], timeout=180)
    assert end.state == "COMPLETED", read_logs(job["job_dir"])
    proc = kit("report", job["job_dir"], "--min-seconds", "0", "--prometheus", "http://127.0.0.1:1")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((Path(job["job_dir"]) / "report.json").read_text())
    check(Path(job["job_dir"]), summary, proc.stdout)
    assert summary["panels"][:3] == ["GPU utilization (%)", "GPU memory used (MiB)", "GPU power (W)"]
    notes = [n for n in proc.stdout.split("notes:\n", 1)[1].splitlines() if n.startswith("  ")]
    assert "  ALERT: node1 gpu1: held with no process on it in 100 % of the samples (at least 50 %): ask for " \
           "fewer GPUs, or check that every rank found its GPU" in notes, proc.stdout
    assert "  ALERT: node1 gpu1: mean utilisation 0.0 %, under 15 %" in notes
    assert not any("gpu0: mean utilisation" in n or "gpu0: held" in n for n in notes)  # the busy one: 80 %
    assert [n["level"] for n in summary["notes"]] == [line.split(":")[0].strip().lower() for line in notes]
