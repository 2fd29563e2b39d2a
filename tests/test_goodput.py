"""Goodput: a job's time cut at the timestamps kit writes, parts that add up to its wall time.

Here on a job directory written by hand, each timestamp chosen, so that every part is known in advance; the
same cut on a real job with a hang and two preemptions: tests/test_recovery.py."""

from __future__ import annotations

import json
import os

import pytest

from kit.jobdir import goodput as gp
from kit.jobdir.layout import JobDir

T0 = 1_764_000_000.0


def _write(path, text: str, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def _run(d: JobDir, run: int, step_start: float, tasks: list[float], timeline: list[str], beat: float) -> None:
    progress = d.run_progress(run)
    _write(progress / JobDir.STEP_START, f"{T0 + step_start:.6f}\n")
    for rank, t in enumerate(tasks):
        _write(progress / JobDir.TASK.format(rank=rank), f"node{rank + 1} {100 + rank} {T0 + t:.6f} host\n")
    lines = [f"{e} {T0 + float(t):.3f} {n}" for e, t, n in (line.split() for line in timeline)]
    _write(progress / JobDir.TIMELINE.format(rank=0), "".join(f"{line}\n" for line in lines))
    _write(progress / JobDir.RANK_PROGRESS.format(rank=0), "step 1\n", T0 + beat)


def _record(run: int, end: str, step: int, start: float | None, stop: float) -> str:
    start_ms = None if start is None else int((T0 + start) * 1000)
    return json.dumps(
        {
            "run": run,
            "end": end,
            "exit_code": 0,
            "checkpoint_step": step,
            "advanced": True,
            "time": int(T0 + stop),
            "start_ms": start_ms,
            "end_ms": int((T0 + stop) * 1000),
        }
    )


@pytest.fixture
def job(tmp_path):
    """Four runs: a hang (run 0), a warning's save and stop (1), a run killed outright and caught up (2), the
    finish (3); the job held 2 nodes, submitted at T0."""
    d = JobDir(tmp_path / "job")
    _write(d / JobDir.JOB_ID, "42\n", T0)
    _write(d / JobDir.SPEC, json.dumps({"nodes": 2}))
    _run(d, 0, 4.5, [6, 7], ["first 10 0", "save 20 10", "saved 21 10", "save 30 20", "saved 32 20", "last 40 29"], 40)
    _run(d, 1, 61, [60.5, 62], ["first 70 20", "last 90 50", "save 91 50", "saved 93 50"], 93)
    _write(d.run_progress(1) / JobDir.PREFLIGHT, "verdict=ok\n", T0 + 65)  # run 1 ran --preflight: its verdict at 65
    _run(d, 2, 100, [101, 100.5], ["first 105 50"], 115)  # killed: no last line, its heartbeat at 115
    _run(d, 3, 130.5, [131, 131], ["first 135 50", "last 150 80"], 150)
    records = [
        _record(0, "hang", 20, 4, 50),
        _record(1, "warned", 50, 60, 95),
        _record(2, "killed", 50, None, 130),  # caught up by run 3 as it started: no start, end_ms is not its end
        _record(3, "finished", 80, 130, 152),
    ]
    _write(d / JobDir.RUNS, "".join(f"{r}\n" for r in records))
    return d


def test_every_part_is_what_the_timestamps_say_and_they_add_up_to_the_wall_time(job):
    g = gp.goodput(job.path)
    expected = {
        "queue": 4,  # submitted at 0, run 0's batch script at 4
        "start": 3 + 2 + 1 + 1,  # to each run's last task's first line
        "preflight": 3,  # run 1's tasks (62) to its verdict (65): its own part, not init's
        "init": 3 + 5 + 4 + 4,  # to rank 0's first step
        "checkpoint": 1 + 2 + 2,  # run 0's two saves, run 1's save on the warning (after its last step)
        "redone": 8 + 10,  # run 0 past the save of step 20 (run 1 resumed there); run 2 all of it (killed, no save)
        "productive": 19 + 20 + 0 + 15,
        "hang": 10,  # run 0's last step (40) to its end (50)
        "ending": 0 + 3 + 0 + 2,
        "restart": 10 + 5 + 15,  # run 2 ended at its heartbeat (115), run 3 began at 130
        "unreported": 0,
    }
    assert {p: round(v, 3) for p, v in g.parts.items()} == expected
    assert g.wall_seconds == pytest.approx(152) == pytest.approx(sum(g.parts.values()))
    held = 152 - 4 - 30
    assert (g.runs, g.nodes, g.live) == (4, 2, False)
    assert g.held_node_seconds == pytest.approx(2 * held) and g.productive_node_seconds == pytest.approx(2 * 54)
    assert g.goodput == pytest.approx(54 / held)
    assert [r["run"] for r in g.per_run] == [0, 1, 2, 3] and g.per_run[0]["hang"] == pytest.approx(10)
    assert g.line().startswith("goodput 45.8%: 54.0 s trained of 152.0 s (2 node(s), 4 run(s)); lost: restart 30.0 s")


def test_a_restart_in_the_allocation_holds_its_nodes_between_the_runs_and_is_counted_apart(job):
    """Run 0's hang followed by a run in the same allocation (runs.jsonl's ``then``): the 10 s to run 1's start are
    still a restart, but held node-time; the other restarts (a requeue, a kill) are not."""
    lines = (job / JobDir.RUNS).read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "then": "restart"})
    (job / JobDir.RUNS).write_text("".join(f"{line}\n" for line in lines))
    g = gp.goodput(job.path)
    assert g.parts["restart"] == pytest.approx(30) and g.wall_seconds == pytest.approx(sum(g.parts.values()))
    held = 152 - 4 - 30 + 10
    assert g.held_node_seconds == pytest.approx(2 * held) and g.goodput == pytest.approx(54 / held)
    assert g.restarts_in_allocation == 1
    assert "(2 node(s), 4 run(s), 1 restart(s) in the allocation, 2 requeue(s));" in g.line()


def test_an_array_tasks_queue_and_nodes_are_its_arrays(job, tmp_path):
    """An array task's directory (``tasks/<i>/``) has its runs but not the submission's records: its queue counts
    from the array's submission and its nodes are the array's --nodes, as a single job's are."""
    import shutil

    array = tmp_path / "array"
    task = array / JobDir.TASKS / "3"
    task.parent.mkdir(parents=True)
    for name in (JobDir.JOB_ID, JobDir.SPEC):
        shutil.copy2(job / name, array / name)
        (job / name).unlink()
    shutil.move(job.path, task)
    g = gp.goodput(task)
    assert (g.parts["queue"], g.nodes) == (pytest.approx(4), 2) and g.wall_seconds == pytest.approx(152)


def test_a_running_job_ends_now_and_its_steps_since_the_last_line_stand(job):
    lines = (job / JobDir.RUNS).read_text().splitlines()
    (job / JobDir.RUNS).write_text("".join(f"{line}\n" for line in lines[:3]))  # run 3 still runs
    g = gp.goodput(job.path, now=T0 + 160)
    assert g.live and g.wall_seconds == pytest.approx(160) == pytest.approx(sum(g.parts.values()))
    assert g.per_run[-1]["productive"] == pytest.approx(25) and "ending" not in g.per_run[-1]
    ended = gp.goodput(job.path, now=T0 + 160, running=False)  # Slurm says it ended: run 3 was killed at 150
    assert not ended.live and ended.wall_seconds == pytest.approx(150)


def test_a_command_that_reports_no_steps_has_no_goodput_and_says_so(tmp_path):
    d = JobDir(tmp_path / "job")
    _write(d / JobDir.JOB_ID, "7\n", T0)
    _write(d.run_progress(0) / JobDir.STEP_START, f"{T0 + 1}\n")
    _write(d.run_progress(0) / JobDir.TASK.format(rank=0), f"node1 5 {T0 + 2} host\n")
    _write(d / JobDir.RUNS, _record(0, "finished", -1, 0.5, 9) + "\n")
    g = gp.goodput(d.path)
    assert g.goodput is None and g.parts["unreported"] == pytest.approx(7) and g.parts["start"] == pytest.approx(1.5)
    assert "goodput n/a (the command reports no steps)" in g.line()
    assert gp.goodput(tmp_path / "never") is None


def test_damaged_records_are_skipped_not_believed(job):
    with open(job.run_progress(0) / JobDir.TIMELINE.format(rank=0), "a") as f:
        f.write("last notatime 3\ngarbage\nfirst 1.0\n")
    (job / JobDir.RUNS).write_text((job / JobDir.RUNS).read_text() + '{"run": "x"}\n{torn')
    g = gp.goodput(job.path)
    assert g.wall_seconds == pytest.approx(152) and g.parts["hang"] == pytest.approx(10)


def test_kit_report_says_the_goodput_and_how_long_the_gpus_sat_idle(job, tmp_path):
    """kit report's line and report.json: the same parts, and the GPUs' idle time read from their samples (one
    GPU idle for 4 of its 10 s, the other busy: 2 s a GPU)."""
    from kit.report.job import report

    log = job.logs / JobDir.METRICS_LOG.format(node="node1", run=0)
    log.parent.mkdir(parents=True, exist_ok=True)
    polls = [
        {
            "time": T0 + 10 + t,
            "node": "node1",
            "up": {},
            "samples": [
                ["DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, 0 if t < 4 else 90],
                ["DCGM_FI_DEV_GPU_UTIL", {"gpu": "1"}, 80],
            ],
        }
        for t in range(11)
    ]
    log.write_text("".join(json.dumps(p) + "\n" for p in polls))
    summary = report(job.path, "42", tmp_path / "r.png", min_seconds=0)
    line = next(x for x in summary.lines() if x.startswith("goodput"))
    assert line.startswith("goodput 45.8%: 54.0 s trained of 152.0 s") and line.endswith(
        "; GPUs idle 2.0 s (mean per GPU)"
    )
    assert (
        "  WARNING: 3 restart(s) cost 58 s: 18 s of steps redone from the last checkpoint, 30 s between runs, "
        "10 s waiting on a hang" in summary.lines()
    )
    numbers = json.loads((tmp_path / "r.json").read_text())["goodput"]
    assert numbers["idle_gpu_seconds"] == 2.0 and numbers["parts"]["hang"] == pytest.approx(10)


def test_the_jobs_events_are_one_timeline_across_its_runs(job):
    """kit events: what each record says happened, in order (run 2's caught-up end before run 3's start, at
    the same moment), here as the +seconds lines `kit events` prints."""
    from kit.jobdir.events import events

    hang = job / "hang" / "r0" / "report"
    _write(hang, "rank=1\nnode=node2\nsummary=rank 1 on node2 its process is T (stopped)\n", T0 + 48)
    _write(job.run_progress(1) / JobDir.WARNING, "USR1\n", T0 + 88)
    _write(job / JobDir.OUTCOME, json.dumps({"state": "COMPLETED", "time": T0 + 153}))
    got = events(job.path)
    assert [(e.time - T0, e.run, e.kind) for e in got] == [
        (0, None, "submitted"),
        (4, 0, "started"),
        (7, 0, "running"),
        (10, 0, "first-step"),
        (48, 0, "hang"),
        (50, 0, "run-ended"),
        (60, 1, "started"),
        (62, 1, "running"),
        (65, 1, "preflight"),
        (70, 1, "first-step"),
        (88, 1, "warned"),
        (95, 1, "run-ended"),
        (100, 2, "started"),
        (101, 2, "running"),
        (105, 2, "first-step"),
        (130, 2, "run-ended"),
        (130, 3, "started"),
        (131, 3, "running"),
        (135, 3, "first-step"),
        (152, 3, "run-ended"),
        (153, None, "ended"),
    ]
    lines = [e.line(since=got[0].time) for e in got]
    assert lines[0] == "+      0.0 s          submitted as job 42"
    assert lines[4] == "+     48.0 s  run 0   hang: rank 1 on node2 its process is T (stopped)"
    assert lines[6] == "+     60.0 s  run 1   started (requeued)"
    assert lines[7] == "+     62.0 s  run 1   every task running (2.0 s after the run's start)"
    assert lines[8] == "+     65.0 s  run 1   preflight ok"
    assert lines[10] == "+     88.0 s  run 1   the time limit's warning reached the run"
    assert lines[15] == "+    130.0 s  run 2   ended without a record of its own (killed): the next run found it so"
    assert lines[-2:] == [
        "+    152.0 s  run 3   ended: finished, exit code 0",
        "+    153.0 s          ended COMPLETED (as Slurm gave it): 152.0 s from submission to its end",
    ]


def test_a_hung_runs_training_ends_at_the_stuck_ranks_last_progress(job):
    """Rank 0 stepped on for a moment after rank 1 stopped (the stack dump's ptrace let rank 1 run): the run
    trained no further than rank 1's last progress (35); its wait from there is the hang's, the sum unchanged."""
    _write(job / "hang" / "r0" / "report", "rank=1\nnode=node2\nsummary=rank 1 on node2 its process is T\n", T0 + 48)
    _write(job.run_progress(0) / JobDir.RANK_PROGRESS.format(rank=1), "step 27\n", T0 + 35)
    g = gp.goodput(job.path)
    assert g.per_run[0]["hang"] == pytest.approx(15) and g.per_run[0]["redone"] == pytest.approx(3)
    assert g.wall_seconds == pytest.approx(152) == pytest.approx(sum(g.parts.values()))


def _poll(d: JobDir, run: int, node: str, at: float, ranks: dict[int, tuple[float, float, float]]) -> None:
    """``node``'s metrics log of ``run``, ending in a poll at ``at`` of each rank's (step, samples, last step)."""
    samples = [["node_load1", {}, 1.0]]
    for rank, (step, total, last) in ranks.items():
        samples += [
            ["training_step", {"rank": str(rank)}, step],
            ["training_samples_total", {"rank": str(rank)}, total],
            ["training_last_step_timestamp_seconds", {"rank": str(rank)}, T0 + last],
        ]
    first = {"time": T0 + at - 1, "node": node, "samples": [["node_load1", {}, 1.0]]}
    _write(
        d.logs / f"{node}.r{run}.metrics.jsonl",
        f"{json.dumps(first)}\n{json.dumps({'time': T0 + at, 'node': node, 'samples': samples})}\n",
    )


def test_the_jobs_throughput_and_duration_are_one_tally_of_every_run(job):
    """kit.jobdir.tally: each run's and node's last poll holds its ranks' samples (10 a step here; a torn last line:
    the poll before); a run's first step is init's, not counted; a rank file left by an earlier run is not counted
    again; over the seconds the steps
    ran (goodput's productive and redone), the job's rate is its nodes' summed; the duration is goodput's wall."""
    from kit.jobdir.tally import tally

    # run: (steps begun from, last step); rank 0 on node1, rank 1 on node2, 10 samples a step each.
    for run, begun, last, at in ((0, 0, 29, 41), (1, 20, 50, 92), (2, 50, 55, 114), (3, 50, 80, 151)):
        for rank, node in ((0, "node1"), (1, "node2")):
            steps = last - begun
            _poll(job, run, node, at, {rank: (last, 10.0 * steps, at - 1)})
    # Run 2's node2 shows a file run 1 left (its last step at 90, before run 2 began at 100): not counted again.
    _poll(job, 2, "node2", 114, {1: (50, 300.0, 90)})
    with open(job.logs / "node1.r3.metrics.jsonl", "a") as torn:  # the exporter killed mid-line: the poll before
        torn.write('{"time": 17640')
    t = tally(job.path)
    per_rank = 10 * ((29 - 1) + (30 - 1) + (5 - 1) + (30 - 1))
    assert t.node_samples == {"node1": pytest.approx(per_rank), "node2": pytest.approx(per_rank - 10 * 4)}
    assert t.samples == pytest.approx(2 * per_rank - 40)
    assert t.stepping_seconds == pytest.approx(54 + 18) and t.wall_seconds == pytest.approx(152)
    assert t.rate() == pytest.approx(t.rate("node1") + t.rate("node2")) == pytest.approx((2 * per_rank - 40) / 72)
    assert (
        t.words()
        == f"{t.rate():.1f} samples/s ({t.samples:.0f} samples in 72.0 s of steps); 152.0 s from submission to its end"
    )


def test_a_job_whose_ranks_report_no_samples_has_no_rate(job):
    from kit.jobdir.tally import tally

    t = tally(job.path)
    assert (t.samples, t.rate(), t.wall_seconds) == (None, None, pytest.approx(152))
    assert t.words() == "152.0 s from submission to its end"


def test_a_node_whose_exporter_died_is_said_to_have_lost_it_never_called_slow(job, tmp_path):
    """node2's exporter killed 40 s before run 3's last step: its last poll holds what it had counted then, and
    the report called that healthy node "a slow node". Its rate is unknown (not judged); the report, kit events and
    kit ps say its exporter was lost; node1, whose exporter polled to the end, is rated as before."""
    from kit.job import listing
    from kit.jobdir.events import events
    from kit.jobdir.tally import tally
    from kit.report.job import report

    for rank, node, at in ((0, "node1", 151), (1, "node2", 110)):  # run 3 stepped from 135 to 150
        _poll(job, 3, node, at, {rank: (80 if at > 150 else 60, 300.0 if at > 150 else 100.0, at - 1)})
    t = tally(job.path)
    assert [(lost.run, lost.node) for lost in t.lost] == [(3, "node2")] and t.lost[0].silent_seconds == 40
    assert t.rate("node2") is None and t.rate("node1") is not None
    said = [e.text for e in events(job.path) if e.kind == "exporter-lost"]
    assert said == ["node2's exporter stopped 40 s before run 3's last step: its samples after that are unknown, "
                    "and it is not judged slow or fast"]  # fmt: skip
    summary = report(job.path, "42", tmp_path / "r.png", min_seconds=0)
    text = "\n".join(summary.lines())
    assert said[0] in text and "a slow node" not in text, text
    [row] = listing.list_jobs([job.path.parent], everything=True, only=[job.path], ask=lambda target, names: {})
    assert row.exporters_lost == ["node2"] and "(exporter lost: node2)" in listing.table([row])[1]


def test_a_requeue_is_told_with_kits_reason_once_written_and_slurms_word_once_the_run_ended(tmp_path):
    """`kit launch --wait`'s line for a requeue. Slurm shows the restart the moment a prelaunch asks for it
    (`scontrol requeue`), a few scontrol calls before the prelaunch writes why: a follower that told at once said
    "requeued by Slurm" of kit's own straggler requeue (CI, stop 62). While the run still ends, nothing is told;
    kit's reason once written; Slurm's word once the run has ended without one."""
    from kit.jobdir.events import requeue_line

    d = JobDir(tmp_path / "job")
    _write(d / JobDir.JOB_ID, "42\n", T0)
    _write(d / JobDir.SPEC, json.dumps({"nodes": 1}))
    _run(d, 0, 4.5, [6], ["first 10 0"], 20)
    assert requeue_line(d.path, 1, "COMPLETING") is None
    by_slurm = "requeued by Slurm (an admin, a preemption or a node failure); run 1 comes next"
    assert requeue_line(d.path, 1, "PENDING") == by_slurm
    _write(d.run_progress(0) / JobDir.REQUEUED, "straggler: rank 0 on node1\n", T0 + 30)
    assert requeue_line(d.path, 1, "COMPLETING") == "requeued: straggler: rank 0 on node1; run 1 comes next"
