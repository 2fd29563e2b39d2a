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
