"""kit report's numbers on literal metrics logs with GPU samples."""

from __future__ import annotations

import json
import os

import pytest

from kit.report import report


def test_gpu_summary_from_logs(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = []
    for i in range(11):  # 10 s, one poll a second
        util = 0.0 if i < 4 else 90.0
        lines.append(
            json.dumps(
                {
                    "time": 1000.0 + i,
                    "node": "node1",
                    "samples": [
                        ["DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, util],
                        ["DCGM_FI_DEV_POWER_USAGE", {"gpu": "0"}, 100.0 + 10 * i],
                        ["DCGM_FI_DEV_FB_USED", {"gpu": "0"}, 1000.0 * i],
                        ["training_samples_total", {"rank": "0"}, 64.0 * i],
                    ],
                }
            )
        )
    (logs / "node1.r0.metrics.jsonl").write_text("\n".join(lines) + "\n{torn")
    summary = report(tmp_path, "9", tmp_path / "r.png")
    assert summary.duration_seconds == 10 and summary.samples == 640 and summary.samples_per_second == 64
    (g,) = summary.gpus
    assert (g.node, g.gpu, g.peak_util, g.idle_seconds, g.mean_power_w, g.peak_memory_mib) == (
        "node1",
        "0",
        90.0,
        4.0,
        150.0,
        10000.0,
    )
    assert abs(g.mean_util - 90 * 7 / 11) < 1e-9
    assert "node1 gpu0: mean util 57.3%, peak 90%, idle 4 s, mean power 150 W, peak memory 9.8 GiB" in summary.lines()
    assert summary.panels == [
        "GPU utilization (%)",
        "GPU memory used (MiB)",
        "GPU power (W)",
        "Training throughput (samples/s)",
    ]  # only what was measured
    assert [(n.level, n.text) for n in summary.notes] == [
        ("info", "the job's metrics span 10 s: utilisation notes need 300 s of samples (--min-seconds)")
    ]
    assert (tmp_path / "r.png").stat().st_size > 20_000


def test_an_ambiguous_job_id_is_refused_with_the_candidates(tmp_path):
    from helpers import kit

    for name in ("a", "b"):
        (tmp_path / "jobs" / name).mkdir(parents=True)
        (tmp_path / "jobs" / name / "job_id").write_text("7\n")
    proc = kit("report", "7", "--output-dir", str(tmp_path / "jobs"))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"kit: JOB: job id 7 names 2 job directories under {tmp_path / 'jobs'}",
        f"  {tmp_path / 'jobs' / 'a'}",
        f"  {tmp_path / 'jobs' / 'b'}",
        "hint: give the job directory itself",
    ]


def test_a_job_name_that_is_one_of_the_users_jobs_names_it(tmp_path):
    """`kit logs NAME` (and every command taking JOB): a --job-name that is one of the user's jobs names it; one
    that names two is refused with both, newest first; one that names none says where it looked."""
    from helpers import kit

    for d, job_id, name in (("a", "7", "alpha"), ("b", "8", "alpha"), ("c", "9", "beta")):
        (tmp_path / "jobs" / d).mkdir(parents=True)
        (tmp_path / "jobs" / d / "job.json").write_text(json.dumps({"job_name": name}))
        (tmp_path / "jobs" / d / "job_id").write_text(f"{job_id}\n")
        os.utime(tmp_path / "jobs" / d / "job_id", (1000 + int(job_id), 1000 + int(job_id)))
    (tmp_path / "jobs" / "c" / "logs").mkdir()
    (tmp_path / "jobs" / "c" / "logs" / "rank-0.r0.log").write_text("beta's own line\n")
    home = {"KIT_HOME": str(tmp_path / "home")}
    found = kit("logs", "beta", "--output-dir", str(tmp_path / "jobs"), env=home)
    assert found.returncode == 0 and "beta's own line" in found.stdout, found.stdout + found.stderr
    two = kit("logs", "alpha", "--output-dir", str(tmp_path / "jobs"), env=home)
    assert two.returncode == 2 and two.stderr.splitlines() == [
        "kit: JOB: 2 of your jobs are named 'alpha'",
        f"  8  {tmp_path / 'jobs' / 'b'}",
        f"  7  {tmp_path / 'jobs' / 'a'}",
        "hint: give the job id or its directory (newest first above)",
    ], two.stderr
    none = kit("logs", "gamma", "--output-dir", str(tmp_path / "jobs"), env=home)
    assert none.returncode == 2 and none.stderr.startswith("kit: JOB: no job with id or name 'gamma'"), none.stderr


def test_damaged_metrics_logs_are_skipped_and_counted(tmp_path):
    """A job that filled its disk, or logs damaged otherwise: lines
    are skipped and counted, never a traceback."""
    from helpers import kit

    logs = tmp_path / "job" / "logs"
    logs.mkdir(parents=True)
    (tmp_path / "job" / "job_id").write_text("5\n")
    (logs / "node2.r0.metrics.jsonl").write_text("")  # the exporter's disk was full
    good = [
        json.dumps(
            {
                "time": 100.0 + i,
                "node": "node1",
                "samples": [
                    ["training_samples_total", {"rank": "0"}, 10.0 * i],
                    ["training_loss", {"rank": "0"}, None],
                ],
            }
        )
        for i in range(3)
    ]
    damaged = [
        "[1,2]",
        json.dumps({"node": "node1", "samples": []}),
        json.dumps({"time": 101.5, "samples": [["training_samples_total", {"rank": "0"}]]}),
        json.dumps({"time": "soon", "samples": []}),
        "{torn",
    ]
    (logs / "node1.r0.metrics.jsonl").write_text("\n".join(good[:1] + damaged + good[1:]) + "\n")
    proc = kit("report", str(tmp_path / "job"))
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("job 5 (data: metrics logs") and first.endswith("; 5 damaged log line(s) skipped)")
    assert "samples: 20 (10.0 samples/s)" in proc.stdout

    for f in logs.iterdir():
        f.write_text("")
    empty = kit("report", str(tmp_path / "job"))
    assert empty.returncode == 1 and "Traceback" not in empty.stderr
    assert empty.stderr.splitlines()[0] == (
        "kit: JOB: nothing to report yet: no readable samples in its metrics logs: the job ended before its "
        "exporter's first poll, or its disk was full, and no run of it has been recorded"
    )


def _record(t, node, samples):
    return json.dumps({"time": t, "node": node, "samples": samples})


def test_notes_flag_waste_restarts_and_a_slow_node_with_their_thresholds(tmp_path):
    """Two nodes, two runs (a requeue at step 40, checkpoint at 30), hand-computed numbers."""
    logs = tmp_path / "logs"
    logs.mkdir()
    GIB = 1024**3
    for node, speed in (("node1", 100.0), ("node2", 50.0)):  # node2 trains at half the speed
        for run, (start, n) in enumerate(((1000.0, 41), (1100.0, 21))):
            lines = []
            for i in range(n):
                t = start + i
                gpu0 = ["DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, 90.0]
                gpu1 = ["DCGM_FI_DEV_GPU_UTIL", {"gpu": "1"}, 0.0]  # held, never used
                lines.append(
                    _record(
                        t,
                        node,
                        [
                            gpu0,
                            gpu1,
                            ["gpu_compute_processes", {"gpu": "0"}, 1.0],
                            ["gpu_compute_processes", {"gpu": "1"}, 0.0],
                            ["DCGM_FI_DEV_FB_USED", {"gpu": "0"}, 8192.0],
                            ["DCGM_FI_DEV_FB_FREE", {"gpu": "0"}, 73728.0],
                            ["kit_job_cpu_seconds_total", {}, 1.0 * i],  # one core busy
                            ["kit_job_cpus", {}, 8.0],
                            ["kit_job_memory_rss_bytes", {}, 2.0 * GIB],
                            ["kit_job_memory_limit_bytes", {}, 4.0 * GIB],
                            ["node_cpu_seconds_total", {"mode": "user"}, 3.0 * i],
                            ["node_cpu_seconds_total", {"mode": "idle"}, 1.0 * i],
                            ["training_samples_total", {"rank": "0" if node == "node1" else "1"}, speed * i],
                            ["training_step", {"rank": "0" if node == "node1" else "1"}, (30 if run else 0) + i],
                            ["training_step_duration_seconds", {"rank": "0" if node == "node1" else "1"}, 0.5],
                            ["training_loss", {"rank": "0" if node == "node1" else "1"}, 2.0 / (1 + i + 40 * run)],
                        ],
                    )
                )
            (logs / f"{node}.r{run}.metrics.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "runs.jsonl").write_text(
        '{"run": 0, "end": "warned", "exit_code": 0, "checkpoint_step": 30, "advanced": true, "time": 1041}\n'
        '{"run": 1, "end": "finished", "exit_code": 0, "checkpoint_step": 50, "advanced": true, "time": 1121}\n'
    )
    s = report(tmp_path, "7", tmp_path / "r.png", min_seconds=60)
    assert s.duration_seconds == 120 and s.runs == 2
    assert s.samples == 100 * (40 + 20) + 50 * (40 + 20)
    assert (s.first_loss, s.last_loss) == (2.0, 2.0 / 61)
    n1, n2 = s.nodes
    assert (n1.cpus_allocated, n1.cpu_cores_used, n1.cpu_efficiency_percent) == (8.0, 1.0, 12.5)
    assert n1.node_cpu_busy_percent == 75.0
    assert (n1.memory_peak_bytes, n1.memory_limit_bytes, n1.memory_limit_of, n1.memory_peak_percent) == (
        2.0 * GIB,
        4.0 * GIB,
        "allocation",
        50.0,
    )
    assert (n1.samples_per_second, n2.samples_per_second) == (100.0, 50.0)
    g0, g1, *_ = s.gpus
    assert (g1.gpu, g1.mean_util, g1.no_process_percent, g0.memory_total_mib) == ("1", 0.0, 100.0, 81920.0)
    # run 0 reached step 40 with its checkpoint at 30: 10 steps redone at 0.5 s; 60 s between the runs
    assert (s.redone_steps, s.mean_step_seconds, s.restart_gap_seconds, s.lost_seconds) == (10.0, 0.5, 60.0, 65.0)
    notes = [(n.level, n.text) for n in s.notes]
    assert (
        "alert",
        "node1 gpu1: held with no process on it in 100 % of the samples (at least 50 %): ask for "
        "fewer GPUs, or check that every rank found its GPU",
    ) in notes
    assert ("alert", "node1 gpu1: mean utilisation 0.0 %, under 15 %") in notes
    assert ("info", "node1 gpu0: peak memory 10 % of the GPU's, under 50 %: a larger batch would fit") in notes
    assert (
        "warning",
        "node1: the job used 1.00 of 8 allocated cores (12 %, under 50 %): ask for fewer CPUs, "
        "or use them (data loaders)",
    ) in notes
    assert (
        "warning",
        "1 restart(s) cost about 65 s: 10 step(s) redone from the last checkpoint, 60 s between runs",
    ) in notes
    assert ("warning", "node2: 50.0 samples/s, under 80 % of the median node's 75.0: a slow node") in notes
    assert not any("gpu0: mean utilisation" in t for _, t in notes)  # 90 %: nothing to say
    assert s.panels == [
        "GPU utilization (%)",
        "GPU memory used (MiB)",
        "CPU (cores busy)",
        "Memory (GiB)",
        "Training loss",
        "Step time (s)",
        "Training throughput (samples/s)",
    ]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["lost_seconds"] == 65.0 and len(doc["notes"]) == len(s.notes) and doc["panels"] == s.panels


def test_without_matplotlib_the_report_is_its_numbers_and_one_line(tmp_path):
    """`pip install kit` without the report extra: kit report prints its
    summary, writes report.json, and says in one line what to install for the picture."""
    import os
    import subprocess
    import sys

    logs = tmp_path / "job" / "logs"
    logs.mkdir(parents=True)
    lines = [
        json.dumps(
            {"time": 1000.0 + i, "node": "node1", "samples": [["training_samples_total", {"rank": "0"}, 64.0 * i]]}
        )
        for i in range(5)
    ]
    (logs / "node1.r0.metrics.jsonl").write_text("\n".join(lines) + "\n")
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "matplotlib.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "kit", "report", str(tmp_path / "job"), "--prometheus", "http://127.0.0.1:1"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{hide}:{os.environ.get('PYTHONPATH', '')}"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (
        "kit: warning: no picture: matplotlib is not installed; pip install 'kit-slurm[report]' "
        "(the numbers and report.json need nothing more)\n"
    ), proc.stderr
    assert "samples: 256 (64.0 samples/s)" in proc.stdout
    assert proc.stdout.rstrip().endswith(f"report: {tmp_path / 'job' / 'report.json'}")
    assert json.loads((tmp_path / "job" / "report.json").read_text())["panels"] == ["Training throughput (samples/s)"]
    assert not (tmp_path / "job" / "report.png").exists()


def test_a_falling_job_cpu_counter_is_no_restart_and_never_over_the_allocation(tmp_path):
    """Under pyxis the first task's process carries `enroot create`'s
    CPU time (here 30 s) until it exits mid-run; the job's CPU counter then falls. One run,
    one core busy of 2: 50 %, not the fall read as a restart from 0 (which gave 114 %)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = []
    for i in range(61):
        cpu = 30.0 + i if i < 30 else float(i)  # the setup's 30 s leave the sum at t=30
        lines.append(_record(1000.0 + i, "node1", [["kit_job_cpu_seconds_total", {}, cpu], ["kit_job_cpus", {}, 2.0]]))
    (logs / "node1.r0.metrics.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "runs.jsonl").write_text(
        '{"run": 0, "end": "finished", "exit_code": 0, "checkpoint_step": -1, "advanced": false, "time": 1061}\n'
    )
    s = report(tmp_path, "7", tmp_path / "r.png", min_seconds=10)
    (n1,) = s.nodes
    assert s.runs == 1 and not any("restart" in n.text for n in s.notes), s.notes
    assert n1.cpu_efficiency_percent <= 50.0 and n1.cpu_cores_used == 59 / 60, n1


def test_task_starts_per_node_and_run_from_the_job_directory(tmp_path):
    """kit.jobdir.task_starts: from the step's start (prelaunch, before srun) to each node's
    first task's first line; damaged records are skipped, never a traceback."""
    from kit import jobdir

    r0, r1 = tmp_path / "progress" / "r0", tmp_path / "progress" / "r1"
    r0.mkdir(parents=True)
    r1.mkdir()
    (r0 / "step-start").write_text("1000.5\n")
    (r0 / "task-0").write_text("node1 123 1001.7 squashfuse\n")
    (r0 / "task-1").write_text("node2 124 1002.0 nonsense\n")  # a mode kit never writes: unknown
    (r0 / "task-2").write_text("node1 125 1001.9\n")  # node1's first task counts
    (r0 / "task-3").write_text("node3 126\n")  # an older launcher: no start
    (r0 / "task-4").write_text("../x 1 1001\n")  # not a node name
    (r1 / "step-start").write_text("garbage\n")
    (r1 / "task-0").write_text("node1 1 2000\n")
    assert jobdir.task_starts(tmp_path, 0) == {"node1": 1.2, "node2": 1.5}
    assert jobdir.task_starts(tmp_path, 1) == {} and jobdir.task_starts(tmp_path, 7) == {}
    assert jobdir.all_task_starts(tmp_path) == [
        {"run": 0, "node": "node1", "seconds": 1.2, "mode": "squashfuse"},
        {"run": 0, "node": "node2", "seconds": 1.5, "mode": None},
    ]


def _backfilled_prometheus(tmp_path, samples: list[tuple[float, float]]):
    """A real Prometheus holding only ``samples`` of job 9's rank-0 counter (promtool backfills them)."""
    import shutil
    import subprocess
    import time
    import urllib.request

    from kit.cluster.processes import free_ports

    tmp_path.mkdir()
    text = "".join(f'training_samples_total{{slurm_job_id="9",node="node1",rank="0"}} {v} {t}\n' for t, v in samples)
    (tmp_path / "om.txt").write_text(text + "# EOF\n")
    data = tmp_path / "tsdb"
    subprocess.run(
        [
            shutil.which("promtool") or "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(tmp_path / "om.txt"),
            str(data),
        ],
        check=True,
        capture_output=True,
    )
    (tmp_path / "p.yml").write_text("global:\n  scrape_interval: 1s\n")
    port = free_ports(1)[0]
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'p.yml'}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(150):
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("prometheus did not start")


def test_a_prometheus_that_saw_part_of_the_job_is_not_the_report_s_source(tmp_path):
    """The CI failure of session 13: Prometheus found a short job's exporter late and held two
    scrapes of its counter, equal; query_range held them flat over the job and the report said
    0.0 samples/s for a job that trained. The metrics logs (every poll) are used instead and the
    report says why; a Prometheus holding the whole job is used, its raw samples read as scraped."""
    import time

    t0 = float(int(time.time()) - 3 * 3600)
    logs = tmp_path / "logs"
    logs.mkdir()
    (tmp_path / "job_id").write_text("9\n")
    (logs / "node1.r0.metrics.jsonl").write_text(
        "".join(
            json.dumps(
                {"time": t0 + i, "node": "node1", "samples": [["training_samples_total", {"rank": "0"}, 64.0 * i]]}
            )
            + "\n"
            for i in range(31)
        )
    )
    late, url = _backfilled_prometheus(tmp_path / "late", [(t0 + 29, 1856.0), (t0 + 30, 1920.0)])
    try:
        summary = report(tmp_path, "9", tmp_path / "r.png", prometheus=url)
    finally:
        late.terminate()
        late.wait(10)
    assert summary.source.startswith(
        "metrics logs (Prometheus holds part of the job only: training_samples_total on node1: 1 s of the logs' 30 s)"
    ), summary.source
    assert (summary.samples, summary.samples_per_second) == (1920.0, 64.0)
    whole, url = _backfilled_prometheus(tmp_path / "whole", [(t0 + i, 64.0 * i) for i in range(0, 31, 3)])
    try:
        summary = report(tmp_path, "9", tmp_path / "r.png", prometheus=url)
    finally:
        whole.terminate()
        whole.wait(10)
    assert summary.source == f"Prometheus {url}" and (summary.samples, summary.samples_per_second) == (1920.0, 64.0)


def test_a_prometheus_that_has_not_seen_the_end_of_a_short_job_is_not_the_report_s_source(tmp_path):
    """The full suite's failure of session 26: a report made as soon as a 9-s job ended (a wait that sees the end
    at once) found Prometheus holding two scrapes from before training began, within GAP of the end: the report
    said 0.0 samples/s for a job that trained. A Prometheus that lacks more than a quarter of a short job (at
    least EDGE_SLACK) at its start or end is not the source: the logs are used."""
    import time

    t0 = float(int(time.time()) - 3 * 3600)
    logs = tmp_path / "logs"
    logs.mkdir()
    (tmp_path / "job_id").write_text("9\n")
    counts = [0.0, 0.0] + [640.0 * i for i in range(1, 8)]
    (logs / "node1.r0.metrics.jsonl").write_text(
        "".join(
            json.dumps({"time": t0 + i, "node": "node1", "samples": [["training_samples_total", {"rank": "0"}, c]]})
            + "\n"
            for i, c in enumerate(counts)
        )
    )
    early, url = _backfilled_prometheus(tmp_path / "early", [(t0, 0.0), (t0 + 1, 0.0)])
    try:
        summary = report(tmp_path, "9", tmp_path / "r.png", prometheus=url)
    finally:
        early.terminate()
        early.wait(10)
    assert summary.source == (
        "metrics logs (Prometheus holds part of the job only: training_samples_total on node1: 1 s of the logs' 8 s)"
    ), summary.source
    assert summary.samples == 4480.0 and summary.samples_per_second == 4480.0 / 8


def test_one_poll_is_no_rate(tmp_path):
    """A job whose exporter polled once: how many samples it trained is unknown (an increase needs
    two polls), never 0 at 0.0 samples/s."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node1.r0.metrics.jsonl").write_text(
        json.dumps({"time": 5.0, "node": "node1", "samples": [["training_samples_total", {"rank": "0"}, 64.0]]}) + "\n"
    )
    summary = report(tmp_path, "9", tmp_path / "r.png")
    assert (summary.samples, summary.samples_per_second) == (None, None) and "samples: -" in summary.lines()


def _many_nodes_logs(job_dir, nodes: int, slow: str, idle: str) -> None:
    """A job of ``nodes`` nodes x 2 ranks, 60 polls: every node alike but ``slow`` (half the
    samples/s) and ``idle`` (its job's CPUs unused)."""
    logs = job_dir / "logs"
    logs.mkdir(parents=True)
    for n in range(1, nodes + 1):
        node = f"node{n}"
        rate = 32.0 if node == slow else 64.0
        busy = 0.05 if node == idle else 3.5 + 0.01 * n
        lines = []
        for i in range(61):
            lines.append(
                json.dumps(
                    {
                        "time": 1000.0 + i,
                        "node": node,
                        "samples": [
                            ["kit_job_cpus", {}, 4.0],
                            ["kit_job_cpu_seconds_total", {}, busy * i],
                            ["kit_job_memory_rss_bytes", {}, 2.0e9 + 1e6 * n],
                            ["kit_job_memory_limit_bytes", {}, 8.0e9],
                            *[["training_samples_total", {"rank": str(2 * (n - 1) + r)}, rate * i] for r in range(2)],
                            *[["training_loss", {"rank": str(2 * (n - 1) + r)}, 2.0 - i / 60] for r in range(2)],
                        ],
                    }
                )
            )
        (logs / f"{node}.r0.metrics.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("nodes", [32, 64])
def test_a_report_on_many_nodes_is_a_summary_with_its_outliers_named(tmp_path, nodes):
    """Past 8 nodes the text gives each measure's spread and names the
    extreme nodes (under 30 lines at 32 nodes, not a line per node), the notes name the slowest and
    the idle node, each panel draws a band and the outliers alone (a handful of legend entries, not
    one per node and rank), and report.json keeps every node."""
    from kit.report.plot import _panels
    from kit.report.series import load_logs

    _many_nodes_logs(tmp_path, nodes, slow="node17", idle="node29")
    summary = report(tmp_path, "9", tmp_path / "r.png", min_seconds=30)
    text = summary.lines()
    assert len(text) < 30, "\n".join(text)
    assert not any(line.startswith("node5:") for line in text), "\n".join(text)
    rates = next(line for line in text if line.startswith("samples/s per node:"))
    assert rates.startswith(
        f"samples/s per node: min 64.0 / median 128.0 / max 128.0 over {nodes} (lowest: node17 64.0"
    ), rates
    cpu = next(line for line in text if line.startswith("CPU efficiency per node:"))
    assert "(lowest: node29 1 %" in cpu, cpu
    notes = [(n.level, n.text) for n in summary.notes]
    assert ("warning", "node17: 64.0 samples/s, under 80 % of the median node's 128.0: a slow node") in notes, notes
    assert any(
        level == "warning" and text.startswith("node29: the job used 0.05 of 4 allocated cores")
        for level, text in notes
    ), notes
    saved = json.loads((tmp_path / "r.json").read_text())
    assert len(saved["nodes"]) == nodes and {n["node"] for n in saved["nodes"]} == {
        f"node{i}" for i in range(1, nodes + 1)
    }
    for title, curves in _panels(load_logs(tmp_path).series):
        assert len(curves) <= 8, (title, [c[0] for c in curves])
        bands = [c for c in curves if "band" in c[2]]
        assert bands, (title, [c[0] for c in curves])
    throughput = dict(_panels(load_logs(tmp_path).series))["Training throughput (samples/s)"]
    assert [c[0] for c in throughput] == [
        f"{2 * nodes - 2} ranks: median, min to max",
        "rank 32 (node17)",
        "rank 33 (node17)",
    ]
    assert (tmp_path / "r.png").stat().st_size > 20_000


def test_kit_report_and_job_report_write_the_same_numbers_for_a_job_and_an_array(tmp_path, monkeypatch):
    """`kit report` is parse + Job.summarize + print: the same report.json as Job.report() for a single
    job and for an array job (its task table), and the same lines."""
    from helpers import kit

    import kit as kitlib

    monkeypatch.setenv("KIT_HOME", str(tmp_path / "home"))  # no local cluster: no Prometheus

    def sample(t, rate):
        return json.dumps(
            {
                "time": t,
                "node": "node1",
                "samples": [
                    ["training_samples_total", {"rank": "0"}, rate * (t - 1000)],
                    ["training_loss", {"rank": "0"}, 1 / t],
                ],
            }
        )

    single = tmp_path / "single"
    (single / "logs").mkdir(parents=True)
    (single / "job_id").write_text("41\n")
    (single / "logs" / "node1.r0.metrics.jsonl").write_text("\n".join(sample(1000 + i, 32) for i in range(8)) + "\n")
    array = tmp_path / "array"
    array.mkdir()
    (array / "job_id").write_text("42\n")
    for i in (0, 1):
        task = array / "tasks" / str(i)
        (task / "logs").mkdir(parents=True)
        (task / "params.json").write_text(json.dumps({"lr": str(0.1 * (i + 1))}))
        (task / "logs" / "node1.r0.metrics.jsonl").write_text(
            "\n".join(sample(1000 + t, 16 * (i + 1)) for t in range(6)) + "\n"
        )
    for job_dir in (single, array):
        cli = kit("report", str(job_dir), "--min-seconds", "0", env={"KIT_HOME": str(tmp_path / "home")})
        assert cli.returncode == 0, cli.stderr
        from_cli = json.loads((job_dir / "report.json").read_text())
        (job_dir / "report.json").unlink()
        job = kitlib.Job.from_dir(job_dir)
        assert job.report(min_seconds=0) == from_cli == json.loads((job_dir / "report.json").read_text())
        assert cli.stdout.splitlines()[:-1] == job.summarize(min_seconds=0).lines()
    assert [t["params"] for t in from_cli["tasks"]] == [{"lr": "0.1"}, {"lr": "0.2"}]


def test_tracker_ids_with_terminal_escapes_are_shown_escaped(tmp_path):
    """A tracker's run id and URI come from files the job's code wrote (tracker/): `kit report` shows them
    with their control characters escaped, never as escapes a terminal acts on."""
    from kit.jobdir import JobDir, tracker_runs
    from kit.report.summary import tracker_lines

    tracker = tmp_path / JobDir.TRACKER
    (tracker / "wandb" / "run-20261126_000000-ab\x1b]2;owned\x07cd").mkdir(parents=True)
    (tracker / JobDir.TRACKER_MLFLOW).write_text(json.dumps({"run_id": "r\x1b[2J", "tracking_uri": "file:/x\x1b[0m"}))
    lines = tracker_lines(tracker_runs(tmp_path))
    assert lines[0] == "W&B run ab\\x1b]2;owned\\x07cd" and lines[1] == "MLflow run r\\x1b[2J at file:/x\\x1b[0m", lines
    assert not any(c in "".join(lines) for c in "\x1b\x07")


def test_a_missing_sample_is_drawn_as_a_gap():
    """Samples more than GAP seconds apart are drawn broken (a NaN between them), not bridged by a line."""
    import math

    from kit.report.plot import gapped
    from kit.report.series import GAP

    times, values = gapped([(0.0, 1.0), (5.0, 2.0), (6.0 + GAP, 3.0), (8.0 + GAP, 4.0)])
    assert times[:2] == [0.0, 5.0] and math.isnan(values[2]) and values[3:] == [3.0, 4.0], (times, values)
    assert gapped([(0.0, 1.0), (GAP, 2.0)]) == ([0.0, GAP], [1.0, 2.0])  # GAP apart: still one line


def test_samples_per_second_has_no_false_zeros_and_keeps_a_stall():
    """A rank writes its file at a step's end at most once a second (here every 1.06 s, steps of 60 ms), the exporter
    polls every second: every ~17 s a poll sees the value the last one saw. Drawn as a 0, samples/s dipped to 0 every
    ~15 s in a straggler job. Those repeats are left out while the rank's last step is recent; a stall (no step for
    8 s) still reads 0."""
    from kit.report.series import rates, sample_rates

    key = ("training_samples_total", "node1", "0")
    writes = [1.06 * i for i in range(60)] + [1.06 * 59 + 8 + i for i in range(1, 6)]  # then a stall of 8 s
    series = {key: [], ("training_last_step_timestamp_seconds", "node1", "0"): []}
    for poll in range(int(writes[-1]) + 2):
        seen = [w for w in writes if w <= poll]
        series[key].append((float(poll), 100.0 * len(seen)))
        series[("training_last_step_timestamp_seconds", "node1", "0")].append((float(poll), seen[-1]))
    before = [v for t, v in rates(series[key]) if t < 60]
    assert sum(1 for v in before if v == 0) >= 2  # the old drawing: false zeros
    drawn = sample_rates(series, key)
    assert all(90 < v < 110 for t, v in drawn if t < 62), drawn
    assert any(v == 0 for t, v in drawn if 65 < t < 70), drawn  # the stall


def test_the_report_tells_the_end_as_wait_told_it_and_nothing_a_file_made_up(tmp_path):
    """outcome.json as kit.job.settle.observe keeps it: the --wait end line; Slurm's state alone (kit ps saw it):
    that state; a state or meaning no kit wrote (an escape sequence, a lowercase word): the state at most."""
    from kit.jobdir.layout import JobDir
    from kit.report.summarize import _told_outcome

    path = tmp_path / JobDir.OUTCOME
    for record, told in (
        (
            {"state": "FAILED", "exit_code": 3, "meaning": "the command failed with exit code 3", "restarts": 1},
            "ended FAILED after 1 restart(s): the command failed with exit code 3 (exit code 3)",
        ),
        ({"state": "COMPLETED"}, "ended COMPLETED"),
        ({"state": "FAILED", "exit_code": 1, "meaning": "\x1b[2Jgone"}, "ended FAILED"),
        ({"state": "\x1b[2J"}, None),
        ({"state": "done"}, None),
    ):
        path.write_text(json.dumps(record))
        assert _told_outcome(tmp_path) == told, record
    path.unlink()
    assert _told_outcome(tmp_path) is None


def test_the_pictures_title_and_restart_marks_cover_no_panel_and_no_title(tmp_path):
    """the job's title sits above its first panel, and a restart's mark ("run 1") on the first
    panel covers neither that panel's title nor the job's (measured on the drawn figure's text boxes)."""
    test_notes_flag_waste_restarts_and_a_slow_node_with_their_thresholds(tmp_path)  # its two runs' job directory
    from kit.report.plot import _pyplot, figure
    from kit.report.series import load_logs
    from kit.report.summarize import summarize

    logs = load_logs(tmp_path)
    fig = figure(logs.series, summarize(logs.series, "7", "metrics logs", logs, tmp_path), logs)
    try:
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        first = fig.axes[0]
        job_title, panel_title = fig._suptitle.get_window_extent(r), first.title.get_window_extent(r)
        assert not job_title.overlaps(first.get_window_extent(r)) and not job_title.overlaps(panel_title)
        marks = [t for t in first.texts if t.get_text().strip().startswith("run ")]
        assert [m.get_text().strip() for m in marks] == ["run 1"]
        for mark in marks:
            box = mark.get_window_extent(r)
            assert not box.overlaps(panel_title) and not box.overlaps(job_title), (box, panel_title)
    finally:
        _pyplot().close(fig)
