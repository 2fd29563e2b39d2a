"""Any launcher through kit's launcher forms one correct world:
torchrun started once per node, and plain torch.distributed with kit's ranks."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
from helpers import ALL_REDUCE, check_end, launch_wait, read_logs


def test_plain_torchrun_per_node_forms_one_world(cluster, tmp_path):
    """Without --nnodes/--node-rank/--master-*: torchrun reads the PET_* variables
    the launcher exports, so 2 nodes x 2 processes are one world of 4."""
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.fail("torchrun is not on PATH (it comes with torch)")
    (tmp_path / "ddp.py").write_text(ALL_REDUCE)
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--ntasks-per-node",
        "1",
        command=[torchrun, "--nproc-per-node", "2", str(tmp_path / "ddp.py")],
    )
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log=None, ends=["finished"])
    lines = re.findall(r"rank=(\d) world=(\d+) sum=([0-9.]+)", read_logs(w.job_dir))
    assert sorted(r for r, _, _ in lines) == ["0", "1", "2", "3"], read_logs(w.job_dir)
    assert {(world, total) for _, world, total in lines} == {("4", "6.0")}


def test_the_seed_torchrun_form_with_explicit_options_still_works(cluster, tmp_path):
    (tmp_path / "ddp.py").write_text(ALL_REDUCE)
    script = (
        'exec "$0" -m torch.distributed.run --nnodes="$SLURM_JOB_NUM_NODES" --node_rank="$SLURM_NODEID" '
        '--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" --nproc_per_node=2 "$1"'
    )
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--ntasks-per-node",
        "1",
        command=["bash", "-c", script, sys.executable, str(tmp_path / "ddp.py")],
    )
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log=None, ends=["finished"])
    lines = re.findall(r"rank=(\d) world=(\d+) sum=([0-9.]+)", read_logs(w.job_dir))
    assert sorted(r for r, _, _ in lines) == ["0", "1", "2", "3"]
    assert {(world, total) for _, world, total in lines} == {("4", "6.0")}


def test_a_plain_torch_distributed_script_gets_four_distinct_ranks(cluster, tmp_path):
    """kit's own ranks (no torchrun): 2 nodes x 2 tasks; the seed-003 shape of
    script (DDP, DistributedSampler, rank-0 checkpoint) splits the data four ways."""
    example = Path(__file__).resolve().parent.parent / "launch" / "examples" / "ddp_plain.py"
    w = launch_wait(tmp_path, "--nodes", "2", "--ntasks-per-node", "2", command=[sys.executable, str(example)])
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log=None, ends=["finished"])
    logs = read_logs(w.job_dir)
    ranks = re.findall(r"plain rank=(\d) world=(\d+) samples=(\d+)", logs)
    assert sorted(r for r, _, _ in ranks) == ["0", "1", "2", "3"]
    assert {(world, samples) for _, world, samples in ranks} == {("4", str(3 * 4096 // 4))}  # a quarter each
    losses = [float(v) for v in re.findall(r"plain epoch=\d loss=([0-9.]+)", logs)]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert torch_load_epoch(w.job_dir / "checkpoints" / "plain.pt") == 2
    values = (w.job_dir / "job.env").read_text()
    assert "\nKIT_PER_NODE_LAUNCHER=0\n" in values  # several tasks per node: no per-node variables


def test_a_plain_script_seen_through_the_progress_call_alone(cluster, tmp_path):
    """ddp_plain.py reports with kit.train.progress.step(n, loss=, samples=)
    only (no Lightning): kit ps shows its step, loss and samples/s while it runs, the hang
    watchdog is armed by it, and kit report draws its loss and throughput; a job that
    reports no samples reads `samples: -`, not 0."""
    import json

    from helpers import kit, wait_for

    example = Path(__file__).resolve().parent.parent / "launch" / "examples" / "ddp_plain.py"
    # --hang-timeout 60: the watchdog polls every second (at the default 900 s, every 15 s: this
    # short job could end before its first poll).
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--ntasks-per-node",
        "2",
        "--hang-timeout",
        "60",
        command=[sys.executable, str(example), "--step-delay", "0.05"],
    )

    def running_row():
        rows = json.loads(kit("ps", "--json", "--output-dir", str(tmp_path / "jobs")).stdout)
        row = next((r for r in rows if r["id"] == w.job_id), None)
        return row if row and row["state"] == "RUNNING" and row["step"] and row["samples_per_second"] else None

    row = wait_for(running_row, 120, poll=0.5, what="kit ps showing the plain script's step and samples/s")
    assert row["loss"] is not None and row["max_steps"] == 3 * 4096 // 4 // 64, row
    # The hang watchdog is armed by the same calls, at its next poll.
    wait_for((w.job_dir / "progress" / "seen").exists, 10, poll=0.2, what="the watchdog armed")
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log=None, ends=["finished"])
    rep = kit("report", str(w.job_dir), "--prometheus", "http://127.0.0.1:1")
    assert rep.returncode == 0, rep.stderr
    summary = json.loads((w.job_dir / "report.json").read_text())
    assert {"Training loss", "Training throughput (samples/s)"} <= set(summary["panels"]), summary["panels"]
    assert summary["samples"] > 0 and summary["first_loss"] is not None
    # A command that reports nothing: unknown, shown as unknown.
    quiet = launch_wait(tmp_path, command=["sleep", "3"])
    check_end(cluster, quiet, state="COMPLETED", code=0, finished=True, log=None, ends=["finished"])
    rep = kit("report", str(quiet.job_dir), "--prometheus", "http://127.0.0.1:1")
    assert rep.returncode == 0 and "samples: -" in rep.stdout, rep.stdout + rep.stderr


def torch_load_epoch(path: Path) -> int:
    import torch

    return torch.load(path, map_location="cpu")["epoch"]


def test_mpi_pmi2_gives_every_task_its_pmi_rank(cluster, tmp_path):
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--ntasks-per-node",
        "2",
        "--mpi",
        "pmi2",
        command=["bash", "-c", 'echo "pmi rank=${PMI_RANK-unset} size=${PMI_SIZE-unset} kit=$RANK"'],
    )
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log=None, ends=["finished"])
    found = re.findall(r"pmi rank=(\S+) size=(\S+) kit=(\d)", read_logs(w.job_dir))
    assert sorted(found) == [(str(r), "4", str(r)) for r in range(4)], read_logs(w.job_dir)
    assert "--mpi=pmi2" in (w.job_dir / "job.env").read_text()


def test_an_unknown_mpi_type_is_refused_before_submitting(cluster, tmp_path):
    from helpers import kit

    proc = kit("launch", "--local", "--mpi", "nosuch", "--output-dir", str(tmp_path / "jobs"), "--", "true")
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert lines[0] == "kit: --mpi: unknown MPI type 'nosuch'"
    assert lines[1].startswith("hint: this cluster's srun offers: ") and "pmi2" in lines[1]
    assert not (tmp_path / "jobs").exists() or list((tmp_path / "jobs").iterdir()) == []


def test_the_fsdp2_example_trains_on_two_nodes_through_torchrun(cluster, tmp_path):
    """torch's FSDP2 (fully_shard) on CPU with gloo: 2 nodes x 2 processes, parameters
    sharded four ways, the loss falls."""
    example = Path(__file__).resolve().parent.parent / "launch" / "examples" / "fsdp2.py"
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--ntasks-per-node",
        "1",
        command=[shutil.which("torchrun") or "torchrun", "--nproc-per-node", "2", str(example), "--steps", "30"],
    )
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log=None, ends=["finished"])
    logs = read_logs(w.job_dir)
    first, last = map(float, re.search(r"fsdp2 done first_loss=([0-9.]+) last_loss=([0-9.]+)", logs).groups())
    assert last < first / 3, logs
    held = re.findall(r"fsdp2 rank=(\d) holds (\d+) of (\d+) parameters", logs)
    assert sorted(r for r, _, _ in held) == ["0", "1", "2", "3"]
    total = int(held[0][2])
    assert sum(int(n) for _, n, _ in held) == total and all(int(n) < total / 2 for _, n, _ in held)
    assert "world=4" in logs


def _ops(trace: Path) -> dict:
    import collections
    import json

    events = json.loads(trace.read_text())["traceEvents"]
    return collections.Counter(e.get("name") for e in events if e.get("ph") == "X")


def test_profile_steps_write_a_trace_per_rank_and_gradient_checkpointing_recomputes(cluster, tmp_path):
    """--profile-steps 5-6: one Chrome trace per rank holding exactly those steps;
    with --gradient-checkpointing the forward of the checkpointed layer runs again
    in the backward pass (3 linear ops per step instead of 2) and the loss falls."""
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        command=[
            sys.executable,
            "-m",
            "kit.train",
            "--max-steps",
            "40",
            "--profile-steps",
            "5-6",
            "--gradient-checkpointing",
            "--checkpoint-every",
            "0",
        ],
    )
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log=None, ends=["finished"])
    logs = read_logs(w.job_dir)
    first, last = map(float, re.search(r"first_loss=([0-9.]+) last_loss=([0-9.]+)", logs).groups())
    assert last < first / 2, logs
    traces = sorted((w.job_dir / "profiles").glob("rank-*.json"))
    assert [t.name for t in traces] == ["rank-0.json", "rank-1.json"]
    for trace in traces:
        ops = _ops(trace)
        assert ops["kit.step.5"] == 1 and ops["kit.step.6"] == 1 and ops["kit.step.7"] == 0
        assert ops["aten::linear"] == 2 * 3  # two steps, the first layer recomputed
