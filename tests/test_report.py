"""kit report's numbers on literal metrics logs with GPU samples."""

from __future__ import annotations

import json

from kit.monitor.report import report


def test_gpu_summary_from_logs(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = []
    for i in range(11):  # 10 s, one poll a second
        util = 0.0 if i < 4 else 90.0
        lines.append(json.dumps({"time": 1000.0 + i, "node": "node1", "samples": [
            ["DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, util],
            ["DCGM_FI_DEV_POWER_USAGE", {"gpu": "0"}, 100.0 + 10 * i],
            ["DCGM_FI_DEV_FB_USED", {"gpu": "0"}, 1000.0 * i],
            ["training_samples_total", {"rank": "0"}, 64.0 * i]]}))
    (logs / "node1.r0.metrics.jsonl").write_text("\n".join(lines) + "\n{torn")
    summary = report(tmp_path, "9", tmp_path / "r.png")
    assert summary.duration_seconds == 10 and summary.samples == 640 and summary.samples_per_second == 64
    (g,) = summary.gpus
    assert (g.node, g.gpu, g.peak_util, g.idle_seconds, g.mean_power_w, g.peak_memory_mib) == \
        ("node1", "0", 90.0, 4.0, 150.0, 10000.0)
    assert abs(g.mean_util - 90 * 7 / 11) < 1e-9
    assert "node1 gpu0: mean util 57.3%, peak 90%, idle 4 s, mean power 150 W" in summary.lines()
    assert (tmp_path / "r.png").stat().st_size > 20_000


def test_an_ambiguous_job_id_is_refused_with_the_candidates(tmp_path):
    from conftest import kit

    for name in ("a", "b"):
        (tmp_path / "jobs" / name).mkdir(parents=True)
        (tmp_path / "jobs" / name / "job_id").write_text("7\n")
    proc = kit("report", "7", "--output-dir", str(tmp_path / "jobs"))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"kit: JOB: job id 7 names 2 job directories under {tmp_path / 'jobs'}",
        f"  {tmp_path / 'jobs' / 'a'}", f"  {tmp_path / 'jobs' / 'b'}",
        "hint: give the job directory itself"]


def test_damaged_metrics_logs_are_skipped_and_counted(tmp_path):
    """Issue 9: a job that filled its disk, or logs damaged otherwise: lines
    are skipped and counted, never a traceback."""
    from conftest import kit

    logs = tmp_path / "job" / "logs"
    logs.mkdir(parents=True)
    (tmp_path / "job" / "job_id").write_text("5\n")
    (logs / "node2.r0.metrics.jsonl").write_text("")  # the exporter's disk was full
    good = [json.dumps({"time": 100.0 + i, "node": "node1", "samples": [
        ["training_samples_total", {"rank": "0"}, 10.0 * i], ["training_loss", {"rank": "0"}, None]]})
        for i in range(3)]
    damaged = ["[1,2]", json.dumps({"node": "node1", "samples": []}),
               json.dumps({"time": 101.5, "samples": [["training_samples_total", {"rank": "0"}]]}),
               json.dumps({"time": "soon", "samples": []}), "{torn"]
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
    assert empty.stderr.splitlines()[0] == f"kit: JOB: no readable samples in the metrics logs in {logs}"
