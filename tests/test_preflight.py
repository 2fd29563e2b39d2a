"""Preflight: a node's GPUs checked through NVML — the test library at NVML's C ABI stands in
for the driver, under the unmodified nvidia-ml-py — and the verdict over a job's nodes. On the local cluster,
before a job's first step: below."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from fake_gpus import FakeGpus

from kit.jobdir.runs import read_verdict
from kit.preflight import verdict


def node_check(gpus: FakeGpus, allocated: str = "0,1", burn: str = "0.2", during=None) -> dict:
    """``python -m kit.preflight node`` on the test library's GPUs; ``during`` is done once it listens for Xids
    (while its burn-in runs: 3 s, and torch's import before it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kit.preflight", "node", "--out", "-", "--burn-seconds", "3" if during else burn],
        env={**env, **gpus.env(), "SLURM_JOB_GPUS": allocated, "SLURMD_NODENAME": "node7"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said = proc.stderr.readline()
    assert "listening for Xids on" in said, said + proc.stderr.read()
    if during:
        during(gpus)
    out, err = proc.communicate(timeout=120)
    record = json.loads(out)
    assert proc.returncode == (0 if record["ok"] else 1), err
    return record


def fails(record: dict) -> list[tuple[int | None, str]]:
    return [(f["gpu"], f["what"]) for f in record["findings"] if f["level"] == "fail"]


@pytest.fixture
def gpus(tmp_path) -> FakeGpus:
    return FakeGpus(tmp_path / "nvml-state", count=2)


def test_a_healthy_node_passes_and_its_burn_in_is_measured(gpus):
    record = node_check(gpus)
    assert record["ok"] and fails(record) == [] and record["node"] == "node7"
    assert [g["minor"] for g in record["gpus"]] == [0, 1] and record["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert record["burn"]["device"] == "cpu" and record["burn"]["tflops"] > 0  # no CUDA here: the CPUs'


def test_an_xid_during_the_burn_in_fails_the_node(gpus):
    """NVML delivers an Xid only from its registration on (the test library too): one that comes while the
    burn-in loads the GPUs, as a GPU that falls off the bus under load."""
    record = node_check(gpus, during=lambda g: g.xid(1, 79))
    assert not record["ok"] and fails(record) == [(1, "Xid 79 (fallen off the bus): NVML event")]
    assert record["burn"]["device"] == "cpu"  # it ran: the Xid came during it
    gpus.xids.clear()
    assert node_check(gpus.write())["ok"]  # the next check: NVML gives a new listener no old event


@pytest.mark.parametrize(
    "fault, expected",
    [
        (lambda g: g.set(0, dbe=2), [(0, "2 volatile double-bit ECC error(s) since the driver loaded")]),
        (lambda g: g.set(1, remap_pending=1), [(1, "row remapping pending: the GPU needs a reset")]),
        (lambda g: g.set(0, reasons=0x8), [(0, "clocks held down: hardware slowdown")]),
        (lambda g: g.lose(1), [(None, "GPU at index 1 is lost (fallen off the bus)")]),
    ],
    ids=["double-bit-ecc", "remap-pending", "hw-slowdown", "lost-gpu"],
)
def test_a_sick_gpu_fails_its_node_and_says_why(gpus, fault, expected):
    fault(gpus)
    gpus.write()
    record = node_check(gpus)
    assert not record["ok"] and fails(record) == expected, record["findings"]
    assert record["burn"] == {"device": None}  # a failed node is not burned in: it is out already


def test_a_gpu_slurm_allocated_that_nvml_does_not_see_fails_the_node(gpus):
    record = node_check(gpus, allocated="0-2")
    assert fails(record) == [(2, "allocated by Slurm but NVML does not see it")]


def test_an_xid_an_application_causes_and_a_hot_gpu_are_told_not_failed(gpus):
    gpus.set(1, reasons=0x20).write()
    record = node_check(gpus, during=lambda g: g.xid(0, 13))
    warned = [(f["gpu"], f["what"]) for f in record["findings"] if f["level"] == "warn"]
    assert record["ok"] and warned == [
        (1, "clocks held down: software thermal slowdown (the GPU runs hot)"),
        (0, "Xid 13: NVML event"),
    ]


def test_the_verdict_names_failing_and_slow_nodes_and_counts_the_silent(tmp_path):
    def rec(node: str, tflops: float, fail: str | None = None) -> dict:
        findings = [{"level": "fail", "what": fail, "gpu": 1}] if fail else []
        return {"node": node, "ok": not fail, "findings": findings, "burn": {"device": "cpu", "tflops": tflops}}

    found = {n: rec(n, t) for n, t in (("node1", 1.0), ("node2", 0.9), ("node3", 0.3), ("node4", 1.1))}
    found["node5"] = rec("node5", 1.0, "Xid 79 (fallen off the bus): NVML event")
    got = verdict.decide(found, expected=6)
    assert got["verdict"] == "failed" and got["nodes"] == ["node3", "node5"]
    assert got["why"] == (
        "node3: burn-in 0.3 TFLOP/s, 32 % of the median node's | "
        "node5: FAIL: GPU 1: Xid 79 (fallen off the bus): NVML event | 1 of 6 node(s) gave no preflight record"
    )
    for node, record in found.items():
        verdict.write_record(tmp_path / f"preflight-{node}.json", record)
    (tmp_path / "preflight-junk.json").write_text("{torn")
    written = verdict.judge(tmp_path, expected=5, timeout=0)
    assert written["nodes"] == ["node3", "node5"] and read_verdict(tmp_path) == {
        **written,
        "why": written["why"],
    }
    assert verdict.decide({"node1": found["node1"], "node2": found["node2"]}, 2)["verdict"] == "ok"


SHARED_CORE = """
import json, os, subprocess, sys, time
from kit.preflight import burn
core = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {core})
hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, {core}))
        for _ in range(2)]
try:
    time.sleep(0.5)
    wall = burn.cpu_rate(1.0, clock=time.perf_counter)
    node = burn.burn_in(1.0)["tflops"]
finally:
    for h in hogs:
        h.kill()
        h.wait()
print(json.dumps({"wall": wall, "node": node, "alone": burn.burn_in(1.0)["tflops"]}))
"""


def test_a_nodes_cpu_burn_in_is_not_slowed_by_processes_sharing_its_core():
    """The CPU burn-in (a node without GPUs, the local cluster's) times its products in its own CPU time: on a core
    shared with two busy processes it reads what it reads alone, where wall-clock blocks read a third of it (a node
    of a cluster on one busy host failed the preflight at 43 % of the other's)."""
    proc = subprocess.run([sys.executable, "-c", SHARED_CORE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rates = json.loads(proc.stdout)
    assert rates["wall"] < 0.7 * rates["node"], rates  # the hogs did take the core
    assert rates["node"] > 0.7 * rates["alone"], rates


def test_the_kernel_logs_xids_since_boot_are_read_where_the_user_may(tmp_path):
    """/dev/kmsg's records (one per read there; a file here gives many at once): each NVRM Xid line."""
    from kit.preflight.health import kernel_xids

    log = tmp_path / "kmsg"
    log.write_bytes(
        b"4,512,100,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
        b"6,513,101,-;eth0: link up\n"
        b"4,514,102,-;NVRM: Xid (PCI:0000:86:00): 13, Graphics Exception\n"
    )
    assert kernel_xids(str(log)) == [("0000:3b:00", 79), ("0000:86:00", 13)]
    assert kernel_xids(str(tmp_path / "none")) == []


# ------------------------------------------------------------------ on the local cluster, before the first step


@pytest.fixture
def gpu_cluster(tmp_path):
    from helpers import require

    from kit.cluster import LocalCluster

    require("slurmctld")
    home = tmp_path / "home"
    c = LocalCluster(home)
    c.up(nodes=3, cpus_per_node=2, gpus_per_node=2)
    c.env = {"KIT_HOME": str(home)}
    yield c
    c.down(force=True)


RAN = 'echo "ran on $SLURMD_NODENAME"'


def test_a_sick_node_stops_the_run_before_any_command_and_the_next_run_leaves_it_out(gpu_cluster, tmp_path):
    """3 nodes of 2 GPUs (the test library behind each node's NVML). A 2-node --preflight job lands on node1 and
    node2; node2's GPU 1 has a double-bit ECC error: no command starts, the run ends `preflight`, the job is
    requeued without node2 and finishes on node1 and node3. Then node3 loses sight of a GPU: a 3-node job with
    no restart left fails with 83 before any command, both nodes named."""
    from helpers import check_end, hastened, launch_wait, read_logs, runs

    from kit import slurm

    fleet = {n: FakeGpus(tmp_path / f"nvml-{n}", minors=[0, 1]) for n in ("node1", "node2", "node3")}
    fleet["node2"].set(1, dbe=1).write()
    lib = fleet["node1"].env()["LD_LIBRARY_PATH"]
    gpu_env = ["--env", f"LD_LIBRARY_PATH={lib}", "--env", f"FAKE_NVML_STATE={tmp_path}/nvml-{{node}}"]
    common = ["--preflight", "--gpus-per-node", "2", *gpu_env]
    w = launch_wait(
        tmp_path, "--nodes", "2", "--max-restarts", "1", *common, command=["bash", "-c", RAN], env=gpu_cluster.env
    )
    with hastened(gpu_cluster, w.job_id):
        err = check_end(gpu_cluster, w, state="COMPLETED", code=0, finished=True, log=None, ends=None)
    assert [r["end"] for r in runs(w.job_dir)] == ["preflight", "finished"] and "after 1 restart(s)" in err
    logs = read_logs(w.job_dir)
    said = "no command started: the preflight failed node2: FAIL: GPU 1: 1 volatile double-bit ECC error(s)"
    assert said in logs and "the next run leaves out node2" in logs, logs
    assert sorted(set(re.findall(r"ran on (node\d)", logs))) == ["node1", "node3"]  # run 1's, and only run 1's
    assert not list(w.job_dir.glob("logs/rank-*.r0.log")) or "ran on" not in "".join(
        p.read_text() for p in w.job_dir.glob("logs/rank-*.r0.log")
    )
    first = read_verdict(w.job_dir / "progress" / "r0")
    assert (first["verdict"], first["nodes"], first["checked"]) == ("failed", ["node2"], ["node1", "node2"])
    assert read_verdict(w.job_dir / "progress" / "r1")["checked"] == ["node1", "node3"]
    assert "node2" in slurm.job_status(gpu_cluster.target, w.job_id).excluded_nodes

    fleet["node3"].gpus.pop(1)
    fleet["node3"].write()  # NVML on node3 sees one GPU of the two Slurm gives
    w = launch_wait(
        tmp_path, "--nodes", "3", "--max-restarts", "0", *common, command=["bash", "-c", RAN], env=gpu_cluster.env
    )
    err = check_end(gpu_cluster, w, state="FAILED", code=83, finished=False, log=None, ends=["preflight"])
    assert "a node failed its preflight check before the command started and no restart was left" in err, err
    logs = read_logs(w.job_dir)
    assert "ran on" not in logs and "retry budget spent" in logs
    got = read_verdict(w.job_dir / "progress" / "r0")
    assert (
        got["nodes"] == ["node2", "node3"]
        and "node3: FAIL: GPU 1: allocated by Slurm but NVML does not see it" in (got["why"])
    )
    listed = subprocess.run(
        [sys.executable, "-m", "kit", "ps", "--json", "--output-dir", str(tmp_path / "jobs")],
        env={**os.environ, **gpu_cluster.env},
        capture_output=True,
        text=True,
    )
    (row,) = [r for r in json.loads(listed.stdout) if r["id"] == w.job_id]
    assert (row["preflight"]["verdict"], row["preflight"]["nodes"]) == ("failed", ["node2", "node3"]), row
    report = subprocess.run(
        [sys.executable, "-m", "kit", "report", str(w.job_dir), "-o", str(tmp_path / "r.png")],
        env={**os.environ, **gpu_cluster.env},
        capture_output=True,
        text=True,
    )
    assert "preflight, run 0: failed (node1, node2, node3 checked): node2: FAIL: GPU 1:" in report.stdout, report.stdout
    parts = json.loads((tmp_path / "r.json").read_text())["goodput"]["parts"]
    assert parts["preflight"] > 0, parts  # the preflight's time is its own part, not init's
    # The same checks on the idle nodes, no job: kit check nodes.
    checked = subprocess.run(
        [sys.executable, "-m", "kit", "check", "nodes", "--local", "--gpus-per-node", "2", "--burn-seconds", "0.2"],
        env={**os.environ, **gpu_cluster.env, "LD_LIBRARY_PATH": lib, "FAKE_NVML_STATE": f"{tmp_path}/nvml-{{node}}"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    assert re.match(r"node1 +ok +burn-in [0-9.e+-]+ TFLOP/s$", lines[0]), lines
    assert re.match(r"node2 +FAILED ", lines[1]) and lines[2] == (
        "  FAIL: GPU 1: 1 volatile double-bit ECC error(s) since the driver loaded"
    )
    assert "  FAIL: GPU 1: allocated by Slurm but NVML does not see it" in lines and lines[-1].startswith(
        "verdict: failed: node2: FAIL"
    )


def test_an_image_without_the_nvml_binding_is_told_not_failed(monkeypatch):
    """A container image with no nvidia-ml-py: the GPUs go unchecked (said), the node is not at fault."""
    from kit.preflight import health

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    findings, seen, burned = health.check_gpus({"SLURM_JOB_GPUS": "0,1"}, during=lambda: "burned")
    assert [(f.level, f.what.split(" (")[0]) for f in findings] == [("warn", "nvidia-ml-py is not installed here")]
    assert seen == [] and burned == "burned"


def test_the_verdict_names_a_node_whose_every_link_is_slow_and_never_one_end_of_one_pair():
    from kit.preflight import verdict

    def rec(node, links, **extra):
        return {"node": node, "findings": [], "network": {"links": links, "allreduce_seconds": 0.01, **extra}}

    fast = 2000.0
    three = {
        "node1": rec("node1", {"node2": 9.0, "node3": fast}),
        "node2": rec("node2", {"node1": 9.5, "node3": 8.0}),
        "node3": rec("node3", {"node1": fast, "node2": 8.5}),
    }
    got = verdict.decide(three, 3)
    assert (got["verdict"], got["nodes"]) == ("failed", ["node2"]), got
    assert "node2: every link slow (to node1 9, to node3 8 MB/s" in got["why"], got
    two = {"node1": rec("node1", {"node2": 9.0}), "node2": rec("node2", {"node1": 9.0})}
    assert verdict.decide(two, 2)["verdict"] == "ok"  # one slow pair cannot say which end is slow
    broken = {**three, "node3": {"node": "node3", "findings": [], "network": {"error": "TimeoutError: no node2"}}}
    assert "node3: network test: TimeoutError: no node2" in verdict.decide(broken, 3)["why"]
    everywhere = {n: {"node": n, "findings": [], "network": {"error": "RuntimeError: port"}} for n in ("a", "b")}
    assert verdict.decide(everywhere, 2)["verdict"] == "ok"  # a test that ran nowhere names no node


class _Gloo:
    """Three ranks' torch.distributed as the network test uses it, over threads and queues; a send takes ``LINK``
    seconds (a healthy link: a 1 MiB ping-pong at ~100 MB/s, far under memory's speed, so that a busy host's
    threads cannot make a healthy link look slower than its first measure), from a rank in ``slow`` ``delay`` more."""

    LINK = 0.01

    def __init__(self, n: int, slow: set[int], delay: float):
        import queue
        import threading

        self.n, self.slow, self.delay = n, slow, delay
        self.gate = threading.Barrier(n, timeout=30)
        self.slots: list = [None] * n
        self.lines = {(a, b): queue.Queue() for a in range(n) for b in range(n)}
        self.local = threading.local()

    def barrier(self):
        self.gate.wait()

    def all_gather_object(self, out, obj):
        self.slots[self.local.rank] = obj
        self.gate.wait()
        out[:] = list(self.slots)
        self.gate.wait()

    def send(self, tensor, dst):
        time.sleep(self.LINK + (self.delay if self.local.rank in self.slow else 0.0))
        self.lines[(self.local.rank, dst)].put(None)

    def recv(self, tensor, src):
        self.lines[(src, self.local.rank)].get(timeout=30)


@pytest.mark.parametrize("slow", [False, True], ids=["starved-for-a-moment", "slow"])
def test_a_node_whose_links_looked_slow_is_timed_again_and_keeps_its_best(monkeypatch, slow):
    """n1's every link looked slow in the round-robin (1 MB/s against 100: its process starved of CPU for a
    moment, or its link slow); every node shares its links, and n1's pairs are timed again, apart: starved, its
    links come back fast and no node is slow; slow (each of its sends 50 ms late), they stay slow and n1 is named.
    Every healthy link is ~100 MB/s, the first measures as the second (CI's busy 2 cores made threads' memory-speed
    links 24-106 GB/s, and the healthy link measured first at 1 GB/s then looked slow)."""
    import threading

    import torch

    from kit.preflight import link_test as network

    monkeypatch.setattr(network, "CONFIRM_GAP", 0.01)
    names = ["n1", "n2", "n3"]
    first = [{"n2": 1.0, "n3": 1.0}, {"n1": 1.0, "n3": 100.0}, {"n1": 1.0, "n2": 100.0}]
    gloo = _Gloo(3, {0} if slow else set(), 0.05)
    got: list = [None] * 3

    def rank(r):
        gloo.local.rank = r
        got[r] = network._confirm(gloo, torch, r, 3, names, dict(first[r]))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    measured = dict(zip(names, got))
    assert measured["n2"]["n3"] == 100.0 and measured["n3"]["n2"] == 100.0, measured  # not a suspect's: kept
    if slow:
        assert all(rate < 40 for rate in measured["n1"].values()), measured  # 2 MiB in >= 70 ms
        assert list(verdict.every_link_slow(measured)) == ["n1"], measured
    else:
        assert all(rate > 50 for rate in measured["n1"].values()), measured  # 2 MiB in <= 40 ms, best of 3
        assert verdict.every_link_slow(measured) == {}, measured


def test_a_node_behind_a_slow_link_is_named_by_the_network_preflight_and_left_out(four_isolated, tmp_path):
    """4 nodes, each in its own network namespace behind a veth on one bridge; node2's link shaped to 40 Mbit/s each
    way (tc tbf: this kernel has no netem). A 3-node --preflight-network job lands on node1-3: the all-reduce and
    every pair timed, node2 named (each of its links far under the others'), no command started; the job is
    requeued without node2 and finishes on node1, node3 and node4, its pairs all fast."""
    import subprocess

    from helpers import check_end, hastened, launch_wait, read_logs, runs

    from kit.cluster import network

    net = network.from_dict(four_isolated.state().network)
    shape = ["tbf", "rate", "40mbit", "burst", "32kbit", "latency", "400ms"]
    subprocess.run(["ip", "-n", net.namespaces["node2"], "link", "show", "eth0"], check=True, capture_output=True)
    subprocess.run(["tc", "-n", net.namespaces["node2"], "qdisc", "add", "dev", "eth0", "root", *shape], check=True)
    w = launch_wait(
        tmp_path, "--nodes", "3", "--max-restarts", "1", "--preflight-network", command=["bash", "-c", RAN],
        env=four_isolated.env,
    )  # fmt: skip
    with hastened(four_isolated, w.job_id):
        check_end(four_isolated, w, state="COMPLETED", code=0, finished=True, log=None, ends=None)
    assert [r["end"] for r in runs(w.job_dir)] == ["preflight", "finished"]
    first = read_verdict(w.job_dir / "progress" / "r0")
    assert (first["verdict"], first["nodes"]) == ("failed", ["node2"]), first
    assert "node2: every link slow" in first["why"]
    logs = read_logs(w.job_dir)
    assert "the next run leaves out node2" in logs and sorted(set(re.findall(r"ran on (node\d)", logs))) == [
        "node1", "node3", "node4",
    ]  # fmt: skip
    records = {p.name: json.loads(p.read_text()) for p in (w.job_dir / "progress" / "r1").glob("preflight-node*.json")}
    links = [rate for r in records.values() for rate in r["network"]["links"].values()]
    assert len(records) == 3 and len(links) == 6 and min(links) > 10 * 5, records  # every pair far over 40 Mbit/s
    print("network preflight per node, s:", {n: r["network"]["seconds"] for n, r in records.items()})
