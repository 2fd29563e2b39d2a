"""The exporter: GPU collector on a fake NVML with 8 GPUs
(and on real NVML when a GPU is present), promtool, ports and target files."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from fake_gpus import UNKNOWN, FakeGpus, preload
from helpers import require, wait_for

from kit.monitor import naming, training
from kit.monitor.exporter import Exporter
from kit.monitor.gpu import FIELDS, GpuSource, job_gpus
from kit.monitor.node import DISK_EXCLUDE, NodeSource
from kit.monitor.training import TrainingSource


def real_nvml_available() -> bool:
    """A GPU and its driver here (asked in a child: this process loads the test library)."""
    probe = "import pynvml; pynvml.nvmlInit(); assert pynvml.nvmlDeviceGetCount() > 0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML")}
    return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True).returncode == 0


@pytest.fixture(autouse=True)
def gpus(tmp_path, monkeypatch) -> FakeGpus:
    """8 GPUs behind the real binding (pynvml -> libnvidia-ml.so.1 from tests/libnvml)."""
    preload()
    fleet = FakeGpus(tmp_path / "nvml-state")
    fleet.fail(7, "nvmlDeviceGetTotalEccErrors").write()  # not supported on GPU 7
    monkeypatch.setenv("FAKE_NVML_STATE", str(fleet.path))
    return fleet


def by_name(result) -> dict:
    out: dict = {}
    for s in result.samples:
        out.setdefault(s.spec.name, []).append(s)
    return out


def test_gpu_collector_names_labels_values(gpus):
    source = GpuSource(hostname="node7", events=False)
    result = source.poll()
    assert result.success, result.error
    names = by_name(result)
    for spec, _ in FIELDS:
        assert spec.name in names, spec.name
    util = names["DCGM_FI_DEV_GPU_UTIL"]
    assert len(util) == 8
    s3 = [s for s in util if s.labels["gpu"] == "3"][0]
    assert s3.labels == {
        "gpu": "3",
        "UUID": "GPU-00000003-fake",
        "pci_bus_id": "00000000:13:00.0",
        "device": "nvidia3",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node7",
    }
    assert s3.value == 30
    value = {(n, s.labels["gpu"]): s.value for n, ss in names.items() for s in ss if "reason" not in s.labels}
    assert value[("DCGM_FI_DEV_FB_USED", "2")] == 3 * 1024  # MiB
    assert value[("DCGM_FI_DEV_FB_FREE", "2")] == 77 * 1024
    assert value[("DCGM_FI_DEV_POWER_USAGE", "4")] == 104.0  # W
    assert value[("DCGM_FI_DEV_GPU_TEMP", "5")] == 45
    assert value[("DCGM_FI_DEV_SM_CLOCK", "0")] == 1980 and value[("DCGM_FI_DEV_MEM_CLOCK", "0")] == 2619
    assert value[("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "6")] == 6
    assert ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "7") not in value  # not supported on GPU 7: just absent
    assert value[("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "5")] == 5
    assert value[("gpu_compute_processes", "1")] == 1 and value[("gpu_lost", "1")] == 0
    throttle = {(s.labels["gpu"], s.labels["reason"]): s.value for s in names["gpu_clock_throttle_active"]}
    assert throttle[("3", "sw_power_cap")] == 1 and throttle[("3", "gpu_idle")] == 0
    assert throttle[("0", "gpu_idle")] == 1
    assert "modelName" not in names["gpu_clock_throttle_active"][0].labels
    source.close()


@pytest.mark.skipif(not real_nvml_available(), reason="no NVIDIA GPU and driver here (the test library stands in)")
def test_gpu_collector_on_the_real_driver():
    """Where a GPU is present: the same collector on the real driver (in a child process)."""
    code = (
        "from kit.monitor.gpu import FIELDS, GpuSource, job_gpus; r = GpuSource(events=False).poll(); assert r.success, r.error; "
        "names = {s.spec.name for s in r.samples}; "
        "assert all(spec.name in names for spec, _ in FIELDS[:9]), names; "
        "assert all(s.labels['UUID'].startswith('GPU-') for s in r.samples if s.spec.name == 'DCGM_FI_DEV_GPU_UTIL')"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_gpu_collector_survives_per_gpu_errors_a_lost_gpu_and_driver_loss(gpus):
    gpus.fail(2, "nvmlDeviceGetUtilizationRates").fail(2, "nvmlDeviceGetPowerUsage")
    gpus.fail(6, "nvmlDeviceGetMinorNumber", UNKNOWN).write()
    source = GpuSource(events=False)
    result = source.poll()
    assert result.success
    names = by_name(result)
    gpus_with_util = sorted(s.labels["gpu"] for s in names["DCGM_FI_DEV_GPU_UTIL"])
    assert gpus_with_util == ["0", "1", "3", "4", "5", "7"]  # 2 broken call, 6 unreadable handle
    assert "2" in {s.labels["gpu"] for s in names["DCGM_FI_DEV_GPU_TEMP"]}
    assert "2" not in {s.labels["gpu"] for s in names["DCGM_FI_DEV_POWER_USAGE"]}

    gpus.lose(4).write()  # falls off the bus mid-run
    names = by_name(source.poll())
    lost = {s.labels["gpu"]: s.value for s in names["gpu_lost"]}
    assert lost["4"] == 1 and lost["3"] == 0
    assert "4" not in {s.labels["gpu"] for s in names["DCGM_FI_DEV_GPU_TEMP"]}
    assert "4" not in {s.labels["gpu"] for s in names["gpu_compute_processes"]}

    gpus.driver = "missing"  # the driver goes away
    gpus.write()
    gone = source.poll()
    assert not gone.success and gone.samples == [] and "DriverNotLoaded" in gone.error
    gpus.driver = "ok"
    gpus.lost.clear()
    gpus.write()
    back = source.poll()
    assert back.success and len(by_name(back)["DCGM_FI_DEV_GPU_UTIL"]) == 6
    source.close()

    gpus.driver = "uninitialized"  # NVML_ERROR_UNINITIALIZED on every call
    gpus.write()
    uninitialized = GpuSource(events=False).poll()
    assert not uninitialized.success and "Uninitialized" in uninitialized.error
    gpus.driver = "ok"
    gpus.lose(1).write()  # lost before the exporter started
    late = by_name(GpuSource(events=False).poll())
    assert {s.labels["gpu"]: s.value for s in late["gpu_lost"]}["1"] == 1


def test_a_missing_library_or_driver_is_retried_after_a_pause(tmp_path):
    """No libnvidia-ml.so.1 at all (a CPU node): the source is down, and retried after a pause."""
    code = "from kit.monitor.gpu import GpuSource; r = GpuSource(events=False).poll(); print(r.success, r.error)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML") and k != "LD_LIBRARY_PATH"}
    if real_nvml_available():
        pytest.skip("a real driver is here")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout
    assert out.startswith("False ") and "LibraryNotFound" in out, out

    class Missing:  # counts how often the source tries
        calls = 0

        def nvmlInit(self):
            Missing.calls += 1
            raise RuntimeError("NVMLError_LibraryNotFound")

    absent = GpuSource(Missing(), events=False)
    for _ in range(5):  # a source that never worked is retried after a pause, not on every poll
        assert not absent.poll().success
    assert Missing.calls == 1


def test_a_job_serves_only_the_gpus_slurm_gave_it(gpus):
    """Without device cgroups NVML shows every GPU of the node: the exporter in a job serves
    the step's (SLURM_STEP_GPUS, else SLURM_JOB_GPUS) alone."""
    assert job_gpus({"SLURM_STEP_GPUS": "1,3", "SLURM_JOB_GPUS": "0-7"}) == {1, 3}
    assert job_gpus({"SLURM_JOB_GPUS": "0-2,5"}) == {0, 1, 2, 5}
    assert job_gpus({}) is None and job_gpus({"SLURM_STEP_GPUS": "gpu:1"}) is None
    source = GpuSource(events=False, minors={1, 3})
    names = by_name(source.poll())
    assert sorted(s.labels["gpu"] for s in names["DCGM_FI_DEV_GPU_UTIL"]) == ["1", "3"]
    assert sorted(s.labels["gpu"] for s in names["gpu_compute_processes"]) == ["1", "3"]
    source.close()
    # Where a device cgroup shows NVML only the job's GPUs, under numbers other than Slurm's
    # indexes, they are served (not filtered away).
    for minor in (2, 3, 4, 5, 6, 7):
        del gpus.gpus[minor]
    gpus.write()
    names = by_name(GpuSource(events=False, minors={6, 7}).poll())
    assert sorted(s.labels["gpu"] for s in names["DCGM_FI_DEV_GPU_UTIL"]) == ["0", "1"]


def test_xid_events_are_counted_with_their_time(gpus):
    source = GpuSource()
    assert source.poll().success
    assert source.watching.wait(10)  # an XID before the event thread registered is not NVML's to report
    t0 = time.time()
    gpus.xid(5, 79)
    gpus.xid(5, 48)

    def seen():
        names = by_name(source.poll())
        last = {s.labels["gpu"]: s.value for s in names["DCGM_FI_DEV_XID_ERRORS"]}
        count = {s.labels["gpu"]: s.value for s in names["gpu_xid_errors_total"]}
        when = {s.labels["gpu"]: s.value for s in names.get("gpu_xid_last_timestamp_seconds", [])}
        return (last, count, when) if count["5"] == 2 else None

    last, count, when = wait_for(seen, 5, what="the XID events")
    assert last["5"] == 48 and last["4"] == 0 and count["4"] == 0
    assert when["5"] >= t0 - 1 and "4" not in when
    source.close()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def make_exporter(tmp_path: Path, nvml=None, **kw) -> Exporter:
    train_dir = tmp_path / "train"
    training.write(
        train_dir,
        0,
        {
            "step": 12,
            "loss": 0.25,
            "samples_total": 768,
            "step_duration_seconds": 0.05,
            "last_step_timestamp_seconds": 1.7e9,
            "learning_rate": 0.01,
        },
    )
    from kit.monitor.job import JobSource

    sources = [
        GpuSource(nvml, hostname="vm"),
        NodeSource(),
        TrainingSource(train_dir),
        JobSource("4242", "node1", env={"SLURM_CPUS_ON_NODE": "8", "SLURM_MEM_PER_NODE": "4096"}),
    ]
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "train",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_CLUSTER_NAME": "kit",
    }
    return Exporter(sources, interval=0.2, bind="127.0.0.1", env=env, node="node1", **kw)


def promtool_findings(text: str) -> set[str]:
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    findings = {line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.strip()}
    assert (proc.returncode == 0) == (not findings), (proc.returncode, findings)
    return findings


def test_promtool_check_metrics_reports_nothing(tmp_path):
    require("promtool")
    exporter = make_exporter(tmp_path, port=19461, port_max=19470)
    exporter.start()
    try:
        text = scrape(exporter.port)
    finally:
        exporter.stop()
    assert promtool_findings(text) == set()
    # Every source is in it: 8 fake GPUs, the node, the training files.
    assert text.count("DCGM_FI_DEV_GPU_UTIL{") == 8 and 'model_name="NVIDIA H100 80GB HBM3"' in text
    assert "node_memory_mem_available_bytes " in text and "node_cpu_seconds_total{" in text
    assert 'training_loss{rank="0"} 0.25' in text and 'training_samples_total{rank="0"} 768.0' in text
    assert 'kit_exporter_collector_success{collector="gpu"} 1.0' in text
    assert "kit_job_cpus 8.0" in text and "kit_job_cpu_seconds_total " in text
    assert text.count("gpu_compute_processes{") == 8
    assert "_total_total" not in text and 'job="' not in text and 'instance="' not in text


def test_the_text_format_is_prometheus_clients_own():
    """kit writes the text format itself (prometheus_client's import cost every node's start 55 ms of CPU): byte for
    byte what prometheus_client's generate_latest writes for the same families, escapes, counters, NaN and
    infinities included."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import Metric

    from kit.monitor.families import Sample, Spec, families, text

    counter = Spec("kit_bytes_total", "counter", 'Bytes, with a \\ and a\nnewline and "quotes".')
    gauge, unknown = Spec("kit_level", "gauge", "A level."), Spec("kit_thing", "unknown", "Something.")
    samples = [
        Sample(counter, {"node": 'a"b\\c\nd'}, 3),
        Sample(counter, {"node": "n2"}, 0.5),
        Sample(gauge, {}, float("nan")),
        Sample(gauge, {"gpu": "1"}, float("inf")),
        Sample(gauge, {"gpu": "2"}, -float("inf")),
        Sample(unknown, {"a": "1", "b": ""}, -12.25),
    ]
    mine = families(samples)

    class Theirs:
        def collect(self):
            for fam in mine:
                metric = Metric(fam.name, fam.help, fam.type)
                for name, labels, value in fam.samples:
                    metric.add_sample(name, labels, value)
                yield metric

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Theirs())
    assert text(mine) == generate_latest(registry)
    assert text([]) == generate_latest(CollectorRegistry())


def test_the_scrape_server_answers_get_and_head_refuses_the_rest_and_outlasts_a_stuck_client(tmp_path):
    exporter = make_exporter(tmp_path, port=19501, port_max=19510)
    exporter.start()
    stuck = socket.create_connection(("127.0.0.1", exporter.port))  # sends nothing: holds only its own thread
    try:
        assert "kit_exporter_collector_success" in scrape(exporter.port)
        head = urllib.request.Request(f"http://127.0.0.1:{exporter.port}/metrics", method="HEAD")
        with urllib.request.urlopen(head, timeout=10) as r:
            assert r.status == 200 and r.read() == b"" and int(r.headers["Content-Length"]) > 100
            assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        post = urllib.request.Request(f"http://127.0.0.1:{exporter.port}/metrics", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(post, timeout=10)
        assert refused.value.code == 405
    finally:
        stuck.close()
        exporter.stop()


def test_compat_naming_serves_node_exporter_and_dcgm_spelling(tmp_path):
    """--naming compat: the drop-in names, and promtool's camelCase findings on
    exactly those names (the reason they are not the default)."""
    require("promtool")
    exporter = make_exporter(tmp_path, port=19471, port_max=19480, naming="compat")
    exporter.start()
    try:
        text = scrape(exporter.port)
    finally:
        exporter.stop()
    assert "node_memory_MemAvailable_bytes " in text and 'modelName="NVIDIA H100 80GB HBM3"' in text
    assert "node_memory_mem_available_bytes" not in text and "model_name" not in text
    expected = {f"{name} metric names should be written in 'snake_case' not 'camelCase'" for name in naming.METRICS}
    expected |= {f"{spec.name} label names should be written in 'snake_case' not 'camelCase'" for spec, _ in FIELDS}
    expected |= {"DCGM_FI_DEV_XID_ERRORS label names should be written in 'snake_case' not 'camelCase'"}
    assert promtool_findings(text) == expected


def test_busy_port_moves_to_the_next_and_the_target_file_says_so(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 19481))
    busy.listen()
    targets = tmp_path / "targets"
    exporter = make_exporter(tmp_path, port=19481, port_max=19490, targets_dir=targets)
    try:
        exporter.start()
        assert exporter.port == 19482
        (target,) = targets.glob("*.json")
        assert not list(targets.glob(".*"))
        doc = json.loads(target.read_text())
        assert doc == [
            {
                "targets": ["127.0.0.1:19482"],
                "labels": {
                    "slurm_job_id": "4242",
                    "slurm_job_name": "train",
                    "slurm_user": "alice",
                    "slurm_partition": "gpu",
                    "slurm_cluster": "kit",
                    "node": "node1",
                },
            }
        ]
        assert "DCGM_FI_DEV_GPU_UTIL" in scrape(19482)
    finally:
        exporter.stop()
        busy.close()
    assert list(targets.iterdir()) == []
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds it
    s.bind(("127.0.0.1", 19482))  # the port is free again
    s.close()


def test_scrapes_never_call_nvml(tmp_path, monkeypatch):
    """Scrapes serve the poller's cache: a slow driver call cannot stall one."""
    import threading

    import pynvml

    callers = []
    real = pynvml.nvmlDeviceGetUtilizationRates

    def recording(h):
        callers.append(threading.current_thread().name)
        return real(h)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", recording)
    exporter = make_exporter(tmp_path, port=19491, port_max=19499)
    exporter.start()
    try:
        texts = [scrape(exporter.port) for _ in range(5)]
    finally:
        exporter.stop()
    assert all("DCGM_FI_DEV_GPU_UTIL" in t for t in texts)
    assert callers and set(callers) <= {"MainThread", "kit-poller"}, set(callers)


def test_training_file_parsing_on_literals():
    assert training.parse('{"rank": 3, "step": 10, "loss": 0.5, "junk": "x", "lr": "no"}') == {
        "rank": "3",
        "step": 10.0,
        "loss": 0.5,
    }
    assert training.parse('{"rank": 0, "samples_total": true}') == {"rank": "0"}


def test_a_malformed_rank_file_affects_that_rank_only(tmp_path):
    """A JSON list, a number beyond a float, a torn file."""
    training.write(tmp_path, 0, {"step": 7, "loss": 0.5})
    (tmp_path / "rank-1.json").write_text("[1, 2]")
    (tmp_path / "rank-2.json").write_text('{"rank": 2, "step": 1' + "0" * 400 + ', "loss": 0.25}')
    (tmp_path / "rank-3.json").write_text('{"rank": 3, "st')
    (tmp_path / "rank-4.json").write_text("[" * 100000)
    result = TrainingSource(tmp_path).poll()
    assert result.success
    got = {(s.spec.name, s.labels["rank"]): s.value for s in result.samples}
    assert got == {("training_step", "0"): 7.0, ("training_loss", "0"): 0.5, ("training_loss", "2"): 0.25}
    assert result.error == "unreadable: rank-1.json, rank-3.json, rank-4.json"


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--naming", "dcgm"], {}, "argument --naming: invalid choice: 'dcgm'"),
        ([], {"KIT_EXPORTER_NAMING": "dcgm"}, "kit: --naming: expected one of prometheus, compat, got 'dcgm'"),
        (["--port", "94x0"], {}, "kit: --port: not a port or LOW-HIGH range: '94x0'"),
        (["--port", "70000"], {}, "kit: --port: ports are 1-65535, LOW <= HIGH: got '70000'"),
        (["--port", "9500-9400"], {}, "kit: --port: ports are 1-65535, LOW <= HIGH: got '9500-9400'"),
        (["--interval", "0"], {}, "kit: --interval: seconds between polls, 0.05 to 3600: got 0.0"),
        (["--interval", "nan"], {}, "kit: --interval: seconds between polls, 0.05 to 3600: got nan"),
        (["--interval", "-1"], {}, "kit: --interval: seconds between polls, 0.05 to 3600: got -1.0"),
    ],
)
def test_bad_exporter_arguments_are_one_clean_message(argv, env, message):
    proc = subprocess.run(
        [sys.executable, "-m", "kit.monitor", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_node_source_reads_this_machine_like_node_exporter():
    result = NodeSource().poll()
    assert result.success, result.error
    by_name: dict = {}
    for s in result.samples:
        by_name.setdefault(s.spec.name, []).append(s)
    assert len(by_name["node_cpu_seconds_total"]) >= os.cpu_count() * 4
    assert 0 < by_name["node_memory_MemAvailable_bytes"][0].value <= by_name["node_memory_MemTotal_bytes"][0].value
    # Whole disks only, as node_exporter's default device-exclude: no partitions, loop or RAM devices.
    disks = {s.labels["device"] for s in by_name.get("node_disk_read_bytes_total", [])}
    assert disks == {d for d in psutil.disk_io_counters(perdisk=True) or {} if not DISK_EXCLUDE.match(d)}
    for name in ("loop0", "sda1", "nvme0n1p2", "zram0", "vda3"):
        assert DISK_EXCLUDE.match(name)
    for name in ("sda", "nvme0n1", "vda", "md0", "dm-0"):
        assert not DISK_EXCLUDE.match(name)
    assert "lo" in {s.labels["device"] for s in by_name["node_network_receive_bytes_total"]}


def test_array_tasks_are_labelled_on_the_target():
    from kit.monitor.exporter import target_labels

    labels = target_labels({"SLURM_JOB_ID": "43", "SLURM_ARRAY_JOB_ID": "41", "SLURM_ARRAY_TASK_ID": "2"}, "node1", {})
    assert labels == {"slurm_job_id": "43", "slurm_array_job_id": "41", "slurm_array_task_id": "2", "node": "node1"}


def test_the_job_source_counts_only_the_jobs_own_processes_on_its_node():
    """kit_job_*: CPU time and memory of the processes whose environment names this
    job and this node (the local cluster's nodes share one host), and the allocation."""
    import subprocess
    import sys

    from kit.monitor.job import JobSource

    burn = [
        sys.executable,
        "-c",
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\nprint('burned', flush=True)\n"
        "time.sleep(30)",
    ]
    procs = [
        subprocess.Popen(burn, env={**os.environ, "SLURM_JOB_ID": job, "SLURMD_NODENAME": node}, stdout=subprocess.PIPE)
        for job, node in (("4242", "nodeA"), ("4242", "nodeB"), ("9999", "nodeA"))
    ]
    try:
        # Each burner says when it has spent its 0.5 s (a loaded machine takes longer). Not /proc's CPU times
        # compared with 0.5: they count in clock ticks, and a burner's whole life may read 0.49.
        assert [p.stdout.readline() for p in procs] == [b"burned\n"] * 3
        result = JobSource("4242", "nodeA", env={"SLURM_CPUS_ON_NODE": "2", "SLURM_MEM_PER_CPU": "100"}).poll()
        values = {s.spec.name: s.value for s in result.samples}
        assert result.success and values["kit_job_processes"] == 1
        assert 0.4 <= values["kit_job_cpu_seconds_total"] < 1.0  # one burner's 0.5 s, not three
        assert values["kit_job_memory_rss_bytes"] > 1 << 20
        assert (values["kit_job_cpus"], values["kit_job_memory_limit_bytes"]) == (2.0, 200 * 2**20)
        unallocated = JobSource("4242", "nodeA", env={}).poll()
        assert {s.spec.name for s in unallocated.samples} == {
            "kit_job_cpu_seconds_total",
            "kit_job_memory_rss_bytes",
            "kit_job_processes",
        }
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_the_job_source_follows_the_jobs_processes_without_reading_every_environment(monkeypatch):
    """Between full scans (every `rescan` s) a poll reads no process's
    environment: it walks down from the job's known processes (a child is the job's even
    with a cleared environment) and drops those that ended."""
    import subprocess
    import sys
    import time

    import psutil

    from kit.monitor import job as job_source
    from kit.monitor.job import JobSource

    reads, parsed = [], []
    real_environ, real_raw = psutil.Process.environ, job_source.raw_environ
    monkeypatch.setattr(psutil.Process, "environ", lambda self: parsed.append(self.pid) or real_environ(self))
    monkeypatch.setattr(job_source, "raw_environ", lambda pid: reads.append(pid) or real_raw(pid))
    # The job's process: it starts a child with an empty environment once told to (a line on stdin).
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\nsys.stdin.readline()\n"
            "subprocess.Popen(['sleep', '60'], env={})\ntime.sleep(60)",
        ],
        stdin=subprocess.PIPE,
        env={**os.environ, "SLURM_JOB_ID": "4343", "SLURMD_NODENAME": "n"},
    )
    other = subprocess.Popen(
        ["sleep", "60"], env={**os.environ, "SLURM_JOB_ID": "4343", "SLURMD_NODENAME": "n"}, start_new_session=True
    )  # the job's too, but outside the first one's tree
    try:
        source = JobSource("4343", "n", env={}, rescan=3600)

        def count():
            return next(s.value for s in source.poll().samples if s.spec.name == "kit_job_processes")

        assert count() == 2 and len(reads) > 10  # the first poll reads every environment once
        assert sorted(parsed) == sorted([parent.pid, other.pid])  # and parses only the job's (the rest: no match)
        reads.clear()
        parent.stdin.write(b"go\n")
        parent.stdin.flush()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and count() < 3:
            time.sleep(0.1)
        assert count() == 3 and reads == []  # the child, found down the tree; no environment read
        other.kill()
        other.wait()
        assert count() == 2 and reads == []
        source.rescan = 0  # the next poll scans again
        assert count() == 2 and reads
    finally:
        for proc in psutil.Process(parent.pid).children(recursive=True) + [psutil.Process(parent.pid)]:
            proc.kill()
        parent.wait()
        other.kill()
        other.wait()


def test_the_exporter_yields_its_own_scheduling_group_and_never_the_jobs(tmp_path):
    """Under sched_autogroup a nice value weighs only inside a session's group. The launcher starts each
    sidecar's shell in a session of its own (setsid); the exporter's command nices that group (autogroup nice
    10) before Python starts. The same shell inside another session (the task's, where no setsid exists)
    leaves the group's nice alone."""
    from kit.submission.sidecars import EXPORTER

    assert EXPORTER.command.startswith("kit::yield_cpu 10; exec nice -n 19 ")
    launch = Path(__file__).resolve().parent.parent / "launch"
    (made,) = [
        line.strip() for line in (launch / "launcher.sh").read_text().splitlines() if "KIT_SIDECAR_SHELL=" in line
    ]
    shell = f'source "$0" && {made} && exec bash -c "${{KIT_SIDECAR_SHELL}}" kit-sidecar "$1"'

    def group(*prefix: str) -> str:
        record = tmp_path / "record"
        out = subprocess.run(
            [*prefix, "bash", "-c", shell, str(launch / "lib.sh"), str(record)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "KIT_SIDECAR_COMMAND": "kit::yield_cpu 10; cat /proc/self/autogroup"},
        )
        assert record.read_text().startswith("0 "), "the sidecar's end, recorded"
        return out.stdout.strip()

    assert group("setsid", "--wait").endswith(" nice 10")
    # Inside this session the group is the test's own, left as it is: "/autogroup-N nice X", or nothing where
    # the session is the kernel's first (a container's processes often are: that group is no autogroup).
    assert group() == Path("/proc/self/autogroup").read_text().strip()


def test_a_metrics_log_that_cannot_be_written_is_said_once_and_polls_go_on(tmp_path, capfd):
    """A poll's log line that cannot be written (a full disk; here a directory in the file's place): one line on
    stderr saying the exporter goes on, not one per poll; the next poll that can write logs again."""
    from kit.monitor.exporter import Poller

    log = tmp_path / "node1.r0.metrics.jsonl"
    log.mkdir()
    poller = Poller([NodeSource()], log_path=log, node="node1")
    for _ in range(3):
        poller.poll_once()
    assert poller.results["node"].success
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"kit exporter: metrics log {log}: ")
    assert err[0].endswith("(the exporter goes on; polls are not logged while this lasts)")
    log.rmdir()
    poller.poll_once()
    assert json.loads(log.read_text())["node"] == "node1"
    log.unlink()
    log.mkdir()
    poller.poll_once()
    assert len(capfd.readouterr().err.splitlines()) == 1  # a new failure after a success is said again
