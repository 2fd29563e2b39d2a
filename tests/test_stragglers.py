"""Stragglers: each rank's wait at the gradient all-reduce, measured by a DDP communication hook
(kit.train.stragglers), and the judge that names the rank that stays slow (kit.monitor.judges; its record kit.jobdir.slow_ranks)."""

from __future__ import annotations

import json
import re

import pytest

from kit.jobdir import JobDir, slow_ranks, write_rank_metrics
from kit.monitor import judges as judge_lib


def ranks(step: float, waits: dict[int, float], node=lambda r: f"node{r // 2}") -> dict:
    return {r: (node(r), {"step_seconds": step, "collective_wait_seconds": w}) for r, w in waits.items()}


def test_a_rank_that_stays_slow_is_named_after_the_sustained_time_with_its_evidence():
    """Four ranks at 1 s steps; rank 3 computes the whole second where the others compute 0.6 s and wait 0.4 s for
    it: named once it stayed so for SUSTAINED (20) seconds, with its node, factor (1/0.6) and the waits as evidence."""
    judge = judge_lib.Judge()
    slow = ranks(1.0, {0: 0.4, 1: 0.4, 2: 0.4, 3: 0.0})
    seen = [judge.see(slow, t) for t in range(0, 25, 5)]
    assert seen[:4] == [None] * 4  # 0..15 s: not yet sustained
    verdict = seen[4]
    assert (verdict.rank, verdict.node, round(verdict.factor, 2), verdict.since) == (3, "node1", 1.67, 0)
    assert "they wait 400 ms a step for it" in verdict.evidence and "it waits 0 ms" in verdict.evidence
    assert verdict.line().startswith("straggler: rank 3 on node1, 1.67x the other ranks' step")


def test_a_rank_slow_but_for_a_judgement_now_and_then_is_still_named_from_when_it_became_slow():
    """A throttle's rhythm: rank 3 is the outlier in three judgements of four (level with the others in the fourth):
    named at 20 s from its first slow judgement; a rank level in every other judgement is not (test below)."""
    judge = judge_lib.Judge()
    slow, level = ranks(1.0, {0: 0.4, 1: 0.4, 2: 0.4, 3: 0.0}), ranks(1.0, {0: 0.01, 1: 0.02, 2: 0.015, 3: 0.0})
    seen = [judge.see(r, t) for t, r in zip(range(0, 25, 5), [slow, slow, slow, level, slow])]
    assert seen[:4] == [None] * 4 and (seen[4].rank, seen[4].since) == (3, 0), seen


@pytest.mark.parametrize(
    "what, series",
    [
        ("alike ranks", [ranks(1.0, {0: 0.01, 1: 0.02, 2: 0.015, 3: 0.0})] * 6),
        (
            "a save on rank 0 now and then (the outlier changes or goes)",
            [ranks(1.0, {0: 0.0, 1: 0.5, 2: 0.5, 3: 0.5}), ranks(1.0, {0: 0.01, 1: 0.01, 2: 0.0, 3: 0.01})] * 3,
        ),
        ("a slow rank that is not slow by much in time (tiny steps)", [ranks(0.02, {0: 0.01, 1: 0.01, 2: 0.0})] * 6),
        ("one rank alone", [ranks(1.0, {0: 0.0})] * 6),
        ("ranks without the measurement", [{0: ("n", {"step_seconds": 1.0}), 1: ("n", {"step": 3.0})}] * 6),
    ],
)
def test_no_one_is_named_where_no_rank_stays_slow(what, series):
    judge = judge_lib.Judge()
    assert [judge.see(r, 5.0 * i) for i, r in enumerate(series)] == [None] * len(series), what


def test_verdicts_are_recorded_per_rank_and_read_back_from_the_rank_files(tmp_path):
    """The judge reads each rank's newest file of the current run (a rank file of a run long gone is left out);
    record() keeps one entry per rank with its first `since`; read() gives them back; damage reads as none."""
    for rank, (node, wait) in enumerate([("a", 0.3), ("a", 0.3), ("b", 0.0)]):
        write_rank_metrics(
            tmp_path / "metrics" / node,
            rank,
            {"step_seconds": 0.5, "collective_wait_seconds": wait, "last_step_timestamp_seconds": 1000.0},
        )
    write_rank_metrics(
        tmp_path / "metrics" / "old",
        5,
        {"step_seconds": 9.0, "collective_wait_seconds": 0.0, "last_step_timestamp_seconds": 100.0},
    )
    seen = judge_lib.latest(tmp_path)
    assert sorted(seen) == [0, 1, 2] and seen[2][0] == "b"
    judge = judge_lib.Judge()
    first = [judge.see(seen, t) for t in (0.0, 25.0)][1]
    slow_ranks.record(tmp_path, first)
    later = slow_ranks.Straggler(2, "b", 2.5, "more", 40.0, 60.0)
    slow_ranks.record(tmp_path, later)
    (kept,) = slow_ranks.read(tmp_path)
    assert (kept.rank, kept.factor, kept.since, kept.at) == (2, 2.5, 0.0, 60.0)
    (tmp_path / JobDir.STRAGGLERS).write_text(json.dumps({"stragglers": [{"rank": "x"}]}))
    assert slow_ranks.read(tmp_path) == []


def _poll(node: str, gpus: dict[str, tuple[float, int]]) -> str:
    samples = [["training_step", {"rank": "0"}, 3.0]]
    for gpu, (clock, reasons) in gpus.items():
        samples += [
            ["DCGM_FI_DEV_SM_CLOCK", {"gpu": gpu}, clock],
            ["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", {"gpu": gpu}, reasons],
        ]
    return json.dumps({"time": 1.0, "node": node, "up": {}, "samples": samples}) + "\n"


def test_a_stragglers_evidence_names_its_nodes_gpus_held_down_against_the_others(tmp_path):
    """The exporters' logs (each node's last poll of its latest run): a GPU at 1100 MHz held down by a hardware
    slowdown on the straggler's node, against the other nodes' 1980 MHz, is named with its reason; GPUs at full clock
    say so; a node that logged no GPU adds nothing."""
    from kit.monitor.training import gpu_evidence

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.r0.metrics.jsonl").write_text(_poll("a", {"0": (1980, 0), "1": (1980, 1)}) * 2)
    (logs / "b.r0.metrics.jsonl").write_text(_poll("b", {"0": (1980, 0), "1": (1980, 0)}))
    (logs / "b.r1.metrics.jsonl").write_text(_poll("b", {"0": (1975, 0), "1": (1100, 0x8)}))
    (logs / "c.r1.metrics.jsonl").write_text(_poll("c", {}))
    assert gpu_evidence(tmp_path, "b") == (
        "its node's GPUs: GPU 1 at 1100 MHz, held down by hw_slowdown (the other nodes' median SM clock: 1980 MHz)"
    )
    assert gpu_evidence(tmp_path, "a").startswith("its node's 2 GPU(s): none slow or held down")
    assert gpu_evidence(tmp_path, "c") == "" and gpu_evidence(tmp_path, "nowhere") == ""


def test_a_gpu_held_down_names_its_rank_from_nvml_alone_once_it_stays_held(tmp_path):
    """held_down: node b's GPU 1 at 1100 MHz with hw_slowdown against 1980 MHz elsewhere is held; a GPU merely at
    its power cap (sw_power_cap, a loaded GPU's everyday reason) or slow without a slowdown reason is not. The
    GpuJudge names the node's rank at that GPU's place (b's second rank) once it has stayed held SUSTAINED seconds,
    with its evidence, as a GPU verdict; a GPU no longer held is forgotten."""
    from kit.monitor import judges as stragglers
    from kit.monitor.training import held_down

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.r0.metrics.jsonl").write_text(_poll("a", {"0": (1980, 0x1), "1": (1700, 0x4)}))
    (logs / "b.r0.metrics.jsonl").write_text(_poll("b", {"0": (1600, 0), "1": (1100, 0x8 | 0x4)}))
    held = held_down(tmp_path)
    assert list(held) == [("b", "1")], held
    place, factor, evidence = held[("b", "1")]
    assert place == 1 and factor == pytest.approx(1840 / 1100), held  # the median of a's 1980 and 1700
    assert evidence == "GPU 1 at 1100 MHz, held down by hw_slowdown (the other nodes' median SM clock: 1840 MHz)"
    ranks = {0: ("a", {}), 1: ("a", {}), 2: ("b", {}), 3: ("b", {})}
    judge = stragglers.GpuJudge()
    assert judge.see(held, ranks, 100.0) is None
    assert judge.see(held, ranks, 100.0 + stragglers.SUSTAINED - 1) is None
    named = judge.see(held, ranks, 100.0 + stragglers.SUSTAINED)
    assert (named.rank, named.node, named.by, named.since) == (3, "b", "gpu", 100.0), named
    assert named.line() == (
        "straggler: rank 3 on b, its GPU 1.67x slower (GPU 1 at 1100 MHz, held down by hw_slowdown (the other "
        "nodes' median SM clock: 1840 MHz), for 20 s)"
    )
    assert judge.see({}, ranks, 200.0) is None and judge.see(held, ranks, 201.0) is None  # held again: anew
    slow_ranks.record(tmp_path, named)
    assert slow_ranks.read(tmp_path) == [named]  # the kind is kept in stragglers.json


def _ddp_rank(rank: int, world: int, port: int, out: str, delay: float) -> None:
    """One rank of a two-rank DDP (gloo); rank 1 sleeps ``delay`` before each backward pass (a slow rank)."""
    import os
    import time

    import torch
    import torch.distributed as dist

    from kit.train import stragglers

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    watcher = stragglers.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stragglers.values()  # the measurement starts here
    for _ in range(20):
        loss = model(torch.randn(32, 64)).square().mean()
        if rank == 1:
            time.sleep(delay)
        loss.backward()
        opt.step()
        opt.zero_grad()
    taken = stragglers.values()
    grads_alike = [p.detach().clone() for p in model.parameters()]
    dist.barrier()
    with open(f"{out}/rank-{rank}.json", "w") as f:
        json.dump({**taken, "watching": watcher is not None, "first": float(grads_alike[0].flatten()[0])}, f)
    dist.destroy_process_group()


def test_the_hook_times_each_ranks_wait_at_the_all_reduce_and_averages_as_ddp_does(tmp_path):
    """Two gloo ranks, rank 1 50 ms late to every backward pass: rank 0 waits about 50 ms a step at the
    all-reduce, rank 1 (the late one) hardly at all; the gradients are averaged (both ranks' models stay alike)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_ddp_rank, args=(2, port, str(tmp_path), 0.05), nprocs=2, start_method="spawn")
    zero, one = (json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1))
    assert zero["watching"] and one["watching"] and zero["collective_steps"] == one["collective_steps"] == 20
    assert 0.035 <= zero["collective_wait_seconds"] <= 0.2, zero
    assert one["collective_wait_seconds"] < 0.02, one
    assert zero["step_seconds"] >= 0.05 and one["step_seconds"] >= 0.05
    assert zero["first"] == one["first"]  # the same averaged update on both ranks


def test_a_rank_stopped_half_the_time_is_named_everywhere_and_requeued_without_its_node(cluster, tmp_path):
    """The reference trainer, 4 ranks (gloo) on one node at ~0.2 s steps, --on-straggler requeue (that a clean run
    names no one, bench_failslow --quick holds in test_benches): rank 3 is stopped 0.4 s of every 0.6 s
    (SIGSTOP/SIGCONT): within a minute it is named with its node and the factor the steps slowed by — in stragglers.json, kit ps --json, kit events, kit logs
    --errors, the exporter (Prometheus), the --wait end line and kit report —; prelaunch warns the command, which
    saves its checkpoint and stops; the run ends `straggler`, the job is requeued without that node, and the next
    run, on the other node, resumes from the checkpoint and finishes (COMPLETED, exit 0)."""
    import os
    import signal
    import sys
    import threading
    import time
    import urllib.parse
    import urllib.request

    from helpers import hastened, kit, launch_wait, read_logs, wait_for

    from kit.jobdir import records

    train = [sys.executable, "-m", "kit.train", "--max-steps", "160", "--step-delay", "0.2", "--log-every", "10"]
    w = launch_wait(
        tmp_path,
        *("--ntasks-per-node", "4", "--on-straggler", "requeue", "--max-restarts", "1"),
        command=[*train, "--checkpoint-every", "20"],
    )
    wait_for(lambda: len(judge_lib.latest(w.job_dir)) == 4, 120, what="training")
    wait_for(lambda: all("step_seconds" in v for _, v in judge_lib.latest(w.job_dir).values()), 30, what="waits")
    node, pid = (w.job_dir / "progress" / "r0" / "task-3").read_text().split()[:2]
    stop = threading.Event()

    def duty_cycle():
        try:
            while not stop.is_set():
                os.kill(int(pid), signal.SIGSTOP)
                time.sleep(0.4)
                os.kill(int(pid), signal.SIGCONT)
                time.sleep(0.2)
        except ProcessLookupError:  # the run ended
            pass

    thread = threading.Thread(target=duty_cycle)
    onset = time.time()
    thread.start()
    try:
        named = wait_for(lambda: slow_ranks.read(w.job_dir), 60, poll=0.5, what="a straggler verdict")
    finally:
        stop.set()
        thread.join()
        try:
            os.kill(int(pid), signal.SIGCONT)
        except ProcessLookupError:
            pass
    (slow,) = named
    assert (slow.rank, slow.node) == (3, node) and 1.3 <= slow.factor <= 3.5, slow
    assert slow.at - onset <= 60 and "they wait" in slow.evidence
    query = urllib.parse.urlencode({"query": f'kit_job_straggler_slowdown{{slurm_job_id="{w.job_id}"}}'})
    served = wait_for(
        lambda: json.load(urllib.request.urlopen(f"{cluster.prometheus_url()}/api/v1/query?{query}"))["data"]["result"],
        30,
        what="the verdict in Prometheus",
    )
    assert [(r["metric"]["rank"], r["metric"]["straggler_node"]) for r in served] == [("3", node)]
    with hastened(cluster, w.job_id):  # the next run at kit's begin time, not backfill's next pass
        code, err = w.finish(timeout=300)
    assert code == 0 and f"straggler: rank 3 on {node}" in err, err
    assert re.search(rf"run 0 ended straggler[^:]*: straggler: rank 3 on {node}, .*; requeued\n", err), err
    assert re.search(r": requeued: .*; run 1 comes next\n(.*\n)*.*: RUNNING", err), err  # told as it happened
    first, second = records.run_records(w.job_dir)
    assert (first.end, second.end) == ("straggler", "finished"), (first, second)
    assert (w.job_dir / "progress" / "r1" / "task-0").read_text().split()[0] != node
    batch = read_logs(w.job_dir)
    assert f"the step was stopped: straggler: rank 3 on {node}" in batch, batch
    assert f"the next run leaves out {node}" in batch, batch
    resumed = (w.job_dir / "logs" / "rank-0.r1.log").read_text()
    assert "resuming from" in resumed and "done at step=160" in resumed, resumed
    out = str(tmp_path / "jobs")
    (row,) = [r for r in json.loads(kit("ps", "--json", "--output-dir", out).stdout) if r["id"] == w.job_id]
    assert [(s["rank"], s["node"]) for s in row["stragglers"]] == [(3, node)]
    assert 0 < row["goodput"] < 1, row
    table = kit("ps", "--output-dir", out).stdout.splitlines()
    header, line = table[0].split(), next(t for t in table if t.startswith(f"{w.job_id} "))
    assert header[8:10] == ["GOODPUT", "STRAGGLER"], table
    assert re.search(rf" {100 * row['goodput']:.0f}%\s+rank 3@{node}\s", line), table
    told = kit("events", str(w.job_dir)).stdout
    assert f"straggler: rank 3 on {node}" in told, told
    assert "a straggler's warning reached the run (straggler: rank 3 on" in told, told
    assert "the time limit's warning" not in told, told  # it was the straggler's, not the limit's
    from kit.job.listing import JobRow
    from kit.ui.page import job_page

    page = job_page(JobRow.from_json(row), w.job_dir, time.time())
    assert f"straggler: rank 3 on {node}, " in page and f"{100 * row['goodput']:.1f}% of its time trained" in page
    told = kit("logs", str(w.job_dir), "--errors").stdout
    assert told.startswith(f"straggler: rank 3 on {node}"), told
    report = kit("report", str(w.job_dir)).stdout
    assert f"straggler: rank 3 on {node}" in report, report


HELD_RANK = (
    "import os, time\nfrom kit.train import progress\nfor i in range(1, 10**6):\n    progress.step(i, samples=8)\n"
    "    time.sleep(0.2)\n    if os.path.exists(os.environ['KIT_JOB_DIR'] + '/stop'): break\n"
)


def test_a_gpu_held_down_on_one_node_is_named_from_nvml_while_the_steps_show_nothing(cluster, tmp_path):
    """2 nodes x 1 GPU (the NVML test library, through each node's exporter): node2's GPU runs at 1100 MHz held down
    by a hardware slowdown, node1's at 1980 MHz; the ranks' steps are alike (the GPU sets none of them), so only NVML
    can tell. The first node's exporter names node2's rank with the GPU as its evidence; kit ps --json and kit logs
    --errors say so; the job, told only (--on-straggler tell), runs on and completes."""
    import sys

    from fake_gpus import FakeGpus
    from helpers import kit, launch_wait, wait_for

    fleet = {node: FakeGpus(tmp_path / f"nvml-{node}", minors=[0]) for node in ("node1", "node2")}
    fleet["node1"].set(0, sm=1980, reasons=0x1, util=90).write()
    fleet["node2"].set(0, sm=1100, reasons=0x8, util=90).write()
    env = fleet["node1"].env()
    w = launch_wait(
        tmp_path,
        *("--nodes", "2", "--gpus-per-node", "1", "--ntasks-per-node", "1"),
        *("--env", f"LD_LIBRARY_PATH={env['LD_LIBRARY_PATH']}", "--env", f"FAKE_NVML_STATE={tmp_path}/nvml-{{node}}"),
        command=[sys.executable, "-c", HELD_RANK],
    )
    wait_for(lambda: len(judge_lib.latest(w.job_dir)) == 2, 120, what="both ranks' steps")
    node = (w.job_dir / "progress" / "r0" / "task-1").read_text().split()[0]
    assert node == "node2"
    (slow,) = wait_for(lambda: slow_ranks.read(w.job_dir), 60, poll=0.5, what="a GPU verdict")
    assert (slow.rank, slow.node, slow.by) == (1, "node2", "gpu") and slow.factor == pytest.approx(1980 / 1100), slow
    assert slow.evidence.startswith(
        "GPU 0 at 1100 MHz, held down by hw_slowdown (the other nodes' median SM clock: 1980"
    )
    out = str(tmp_path / "jobs")
    (row,) = [r for r in json.loads(kit("ps", "--json", "--output-dir", out).stdout) if r["id"] == w.job_id]
    assert [(s["rank"], s["node"], s["by"]) for s in row["stragglers"]] == [(1, "node2", "gpu")]
    told = kit("logs", str(w.job_dir), "--errors").stdout
    assert told.startswith("straggler: rank 1 on node2, its GPU 1.80x slower (GPU 0 at 1100 MHz"), told
    (w.job_dir / "stop").touch()
    code, err = w.finish(timeout=120)
    assert code == 0 and "straggler: rank 1 on node2" in err, err


def test_a_rank_held_to_a_cpu_quota_is_named_with_its_node(four_isolated, tmp_path):
    """The reference trainer on 4 nodes, each in its own network namespace (--isolated-network: the ranks meet over
    the bridge); node3's trainer is then held to 2 % of a CPU by a cgroup's quota (the noisy neighbour, the
    container with too small a share): it is named, the slow one, with its node, from the ranks' waits; the job,
    told only, runs on until cancelled. (How soon: bench_failslow measures; here, under the suite's load, only that
    it is named.)"""
    import sys

    from helpers import cpu_quota, kit, launch_wait, wait_for

    train = [sys.executable, "-m", "kit.train", "--max-steps", "100000", "--step-delay", "0.05", "--log-every", "50"]
    env = four_isolated.env
    w = launch_wait(tmp_path, "--nodes", "4", command=train, env=env)
    wait_for(
        lambda: len(r := judge_lib.latest(w.job_dir)) == 4 and all("step_seconds" in v for _, v in r.values()),
        180,
        what="every rank's waits",
    )
    node, pid = (w.job_dir / "progress" / "r0" / "task-2").read_text().split()[:2]
    assert node == "node3"
    with cpu_quota(int(pid), 0.02):
        named = wait_for(lambda: slow_ranks.read(w.job_dir), 150, poll=0.5, what="a straggler verdict")
    (slow,) = named
    assert (slow.rank, slow.node, slow.by) == (2, node, "step") and slow.factor >= 1.25, slow
    assert "they wait" in slow.evidence, slow
    assert kit("cancel", str(w.job_dir), env=env).returncode == 0
    code, err = w.finish(timeout=120)
    assert code == 80 and f"straggler: rank 2 on {node}" in err, err


def test_the_kernels_round_trip_and_bytes_of_the_processes_own_connections_are_read():
    """kit.monitor.round_trips asks the kernel (sock_diag) for every established TCP connection: this process's own, a
    100 kB send over loopback, is found by its socket's inode with the bytes acknowledged (100000 and the SYN) and
    the round trip ss prints for it; a family the kernel refuses leaves the others' connections."""
    import os
    import re
    import shutil
    import socket
    import subprocess

    from kit.monitor import round_trips as links

    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as sender:
        receiver, _ = server.accept()
        with receiver:
            sender.sendall(b"x" * 100_000)
            got = 0
            while got < 100_000:
                got += len(receiver.recv(1 << 16))
            mine = links.socket_inodes([os.getpid()])
            found = [c for c in links.tcp_connections() if c["inode"] in mine and c["bytes_acked"] == 100_001]
            assert len(found) == 1, found
            (sent,) = found
            assert sent["local"] == sent["peer"] == "127.0.0.1" and 0 < sent["rtt"] < 1, sent
            # A family the kernel refuses (IPv6 on a kernel booted with ipv6.disable=1) costs only its own sockets.
            assert sent in links.tcp_connections((socket.AF_INET, 99))
            with pytest.raises(OSError, match="sock_diag refused the dump"):
                links.tcp_connections((99,))
            if shutil.which("ss"):  # the same figure ss reads (rtt:<ms>/<var>) for that connection
                port = str(sender.getsockname()[1])
                shown = subprocess.run(["ss", "-tinH", "sport", "=", port], capture_output=True, text=True).stdout
                assert float(re.search(r"\brtt:([\d.]+)/", shown)[1]) == pytest.approx(1e3 * sent["rtt"], abs=1e-3)


def _conn(inode, local, peer, rtt, acked):
    return {"inode": inode, "local": local, "peer": peer, "rtt": rtt, "bytes_acked": acked}


def test_only_the_jobs_busy_links_to_other_addresses_are_links():
    """busy_links: per (local, peer) the round trip of the busiest of the job's connections that sent at least BUSY
    bytes a second since the last poll; a quiet connection (its round trip is delayed acknowledgements), one not the
    job's, one to this node's own address or to loopback, and one first seen now are left out."""
    from kit.monitor import round_trips as links

    mb = 1 << 20
    before = {1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 7: 0}
    now = [
        _conn(1, "10.0.0.1", "10.0.0.2", 0.020, 4 * mb),  # busy: 2 MB/s over the 2 s
        _conn(2, "10.0.0.1", "10.0.0.2", 0.090, 1 * mb),  # busy, less so: the link is its busiest's
        _conn(3, "10.0.0.1", "10.0.0.3", 0.300, 1000),  # quiet
        _conn(4, "10.0.0.1", "10.0.0.1", 0.001, 4 * mb),  # this node's own address
        _conn(5, "::ffff:127.0.0.1", "127.0.0.1", 0.001, 4 * mb),  # loopback
        _conn(6, "10.0.0.1", "10.0.0.4", 0.005, 4 * mb),  # new since the last poll: no rate yet
        _conn(7, "10.0.0.1", "10.0.0.4", 0.005, 4 * mb),  # not the job's
    ]
    got, acked = links.busy_links(now, {1, 2, 3, 4, 5, 6}, before, 2.0)
    assert got == {("10.0.0.1", "10.0.0.2"): 0.020}, got
    assert acked == {c["inode"]: c["bytes_acked"] for c in now if c["inode"] != 7}


def _ring(rtts: dict[tuple[str, str], float]) -> dict[str, dict[tuple[str, str], float]]:
    """Each node's busy links from (sender, receiver) → round trip, node n at 10.0.0.n."""
    out: dict[str, dict] = {}
    for (a, b), rtt in rtts.items():
        out.setdefault(a, {})[(f"10.0.0.{a[-1]}", f"10.0.0.{b[-1]}")] = rtt
    return out


def test_the_node_on_every_slow_link_is_named_once_it_stays_so():
    """A ring of four (n1 → n2 → n3 → n4 → n1, each sending to the next): n2's link slow, so n1's link to n2 (its
    acknowledgements queue behind n2's data) and n2's own are slow, n3 and n4's fast. n2 is on every slow link and
    named once that held SUSTAINED seconds, its first rank, with the round trips; n1, with one fast link, is not.
    One slow link alone, two nodes, or noise under the floor name no one."""
    from kit.monitor import judges as stragglers

    fast, slow = 0.0004, 0.015
    ring = {("n1", "n2"): slow, ("n2", "n3"): slow, ("n3", "n4"): fast, ("n4", "n1"): 0.0002}
    node, factor, evidence = stragglers.slow_link_node(_ring(ring))
    assert node == "n2" and factor == pytest.approx(slow / 0.0003), factor
    assert evidence == "round trips with n1 15.0 ms, with n3 15.0 ms; the job's other busy links 0.30 ms (median)"
    assert stragglers.slow_link_node(_ring({**ring, ("n2", "n3"): fast})) is None  # one slow link: which end?
    assert stragglers.slow_link_node(_ring({("n1", "n2"): slow, ("n2", "n1"): slow})) is None  # two nodes
    noisy = {key: 0.0015 if "n2" in key else 0.0001 for key in ring}  # 15x, but 1.4 ms more: under LINK_AT_LEAST
    assert stragglers.slow_link_node(_ring(noisy)) is None
    ranks = {r: (f"n{1 + r // 2}", {}) for r in range(8)}
    judge = stragglers.LinkJudge()
    assert judge.see(_ring(ring), ranks, 100.0) is None
    assert judge.see(_ring(ring), ranks, 100.0 + stragglers.SUSTAINED - 1) is None
    named = judge.see(_ring(ring), ranks, 100.0 + stragglers.SUSTAINED)
    assert (named.rank, named.node, named.by, named.since) == (2, "n2", "link", 100.0), named
    assert named.line() == f"straggler: rank 2 on n2, its links 50.0x slower ({evidence}, for 20 s)"


def test_a_node_behind_a_slow_link_is_named_from_its_links_round_trips(four_isolated, tmp_path):
    """The reference trainer on 4 nodes, each in its own network namespace (--isolated-network), its gradients ~1 MB
    a step over gloo's TCP; once every rank trains, node2's link is shaped to 40 Mbit/s (tc tbf: this kernel has no
    netem). Every rank slows alike (each waits for the ring), so the ranks' waits name no one; the round trips of
    the job's busy connections do: node2, on every slow link, is named by its links, with them as evidence, in
    stragglers.json and kit ps --json; the job, told only, runs on until cancelled and its end line says so."""
    import subprocess
    import sys
    import time

    from helpers import kit, launch_wait, wait_for

    from kit.cluster import network

    net = network.from_dict(four_isolated.state().network)
    train = [sys.executable, "-m", "kit.train", "--max-steps", "100000", "--hidden", "8192", "--step-delay", "0.05"]
    env = four_isolated.env
    w = launch_wait(tmp_path, "--nodes", "4", command=[*train, "--log-every", "50"], env=env)
    wait_for(
        lambda: len(r := judge_lib.latest(w.job_dir)) == 4 and all("step_seconds" in v for _, v in r.values()),
        180,
        what="every rank's waits",
    )
    on_node2 = [t for t in range(4) if (w.job_dir / "progress" / "r0" / f"task-{t}").read_text().split()[0] == "node2"]
    shape = ["tbf", "rate", "40mbit", "burst", "32kbit", "latency", "400ms"]
    subprocess.run(["tc", "-n", net.namespaces["node2"], "qdisc", "add", "dev", "eth0", "root", *shape], check=True)
    onset = time.time()
    named = wait_for(lambda: slow_ranks.read(w.job_dir), 150, poll=0.5, what="a straggler verdict")
    (slow,) = named
    print(f"slow link: onset -> verdict {slow.at - onset:.1f} s ({slow.line()})")
    assert (slow.rank, slow.node, slow.by) == (on_node2[0], "node2", "link") and slow.factor >= 5, slow
    assert slow.evidence.startswith("round trips with node") and "the job's other busy links" in slow.evidence, slow
    out = str(tmp_path / "jobs")
    (row,) = [r for r in json.loads(kit("ps", "--json", "--output-dir", out, env=env).stdout) if r["id"] == w.job_id]
    assert [(s["rank"], s["node"], s["by"]) for s in row["stragglers"]] == [(slow.rank, "node2", "link")], row
    assert kit("cancel", str(w.job_dir), env=env).returncode == 0
    code, err = w.finish(timeout=120)
    assert code == 80 and f"straggler: rank {slow.rank} on node2, its links" in err, err
