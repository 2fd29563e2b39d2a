"""The exporter process: poll the sources, serve /metrics, advertise itself to Prometheus.

- A background thread polls every source each ``interval`` seconds; scrapes
  serve the cached results, so a slow NVML call never stalls a scrape.
- One collector per source renders its cached results, and one more renders, per
  source, ``kit_exporter_collector_success`` and
  ``kit_exporter_collector_duration_seconds``; none of them raises into a scrape.
- It binds the first free port of a range and writes a Prometheus
  ``file_sd_configs`` target file (temp name, then rename) carrying the job's
  identity as target labels; the file is removed on exit.
- Each poll appends a line to a JSONL metrics log, for analysis without Prometheus.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Iterable

from kit import files
from kit.monitor import scrapes
from kit.monitor.families import Family, Sample, SourceResult, Spec, families, text
from kit.monitor.naming import Naming
from kit.stopping import Stop


def say(line: str) -> None:
    """A line on stderr, or nothing when stderr cannot take it (a full disk). Not the logging module: its import
    is 5 ms of every node's exporter start."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


SUCCESS = Spec("kit_exporter_collector_success", "gauge", "Whether the collector's last poll succeeded.")
DURATION = Spec("kit_exporter_collector_duration_seconds", "gauge", "How long the collector's last poll took.")
# Slurm's variables -> target labels (job identity goes on the target, not on every sample).
JOB_LABELS: tuple[tuple[str, str], ...] = (
    ("slurm_job_id", "SLURM_JOB_ID"),
    ("slurm_job_name", "SLURM_JOB_NAME"),
    ("slurm_user", "SLURM_JOB_USER"),
    ("slurm_account", "SLURM_JOB_ACCOUNT"),
    ("slurm_partition", "SLURM_JOB_PARTITION"),
    ("slurm_cluster", "SLURM_CLUSTER_NAME"),
    ("slurm_array_job_id", "SLURM_ARRAY_JOB_ID"),
    ("slurm_array_task_id", "SLURM_ARRAY_TASK_ID"),
)
RESERVED_LABELS = ("job", "instance")
# What the JSONL log keeps of each poll (enough for `kit report`).
LOGGED = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",  # with the throttle reasons: a straggler's evidence (kit.monitor.training)
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "gpu_compute_processes",
    "training_step",
    "training_loss",
    "training_samples_total",
    "training_tokens_total",
    "training_step_duration_seconds",
    "training_last_step_timestamp_seconds",  # which run a rank's file is of (kit.jobdir.tally)
    "training_tflops",
    "training_mfu",
    "node_load1",
    "node_memory_MemAvailable_bytes",
    "node_memory_MemTotal_bytes",
    "kit_job_cpu_seconds_total",
    "kit_job_memory_rss_bytes",
    "kit_job_processes",
    "kit_job_cpus",
    "kit_job_memory_limit_bytes",
    "kit_job_goodput_seconds",
    "kit_job_goodput_ratio",
    "kit_job_straggler_slowdown",
    "training_collective_wait_seconds",
    "kit_job_link_rtt_seconds",  # the job's busy links (kit.monitor.round_trips), judged on the first node
)
# Logged summed over one label (per-CPU counters: one value per mode, not per CPU and mode).
LOGGED_SUMMED = {"node_cpu_seconds_total": "mode"}


class NoPort(OSError):
    """Every port of the range is taken."""


class Poller:
    def __init__(self, sources: list, interval: float = 1.0, log_path: Path | None = None, node: str = ""):
        self.sources = sources
        self.interval = interval
        self.log_path = log_path
        self.node = node
        self.results: dict[str, SourceResult] = {s.name: SourceResult() for s in sources}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._log_failed = False

    def poll_once(self) -> None:
        for source in self.sources:
            try:
                result = source.poll()
            except Exception as e:  # a source that raises is a down source, never a dead exporter
                result = SourceResult([], False, 0.0, f"{type(e).__name__}: {e}")
            self.results[source.name] = result
        if self.log_path is not None:
            self._append_log()

    def _append_log(self) -> None:
        record = {
            "time": round(time.time(), 3),
            "node": self.node,
            "up": {name: r.success for name, r in self.results.items()},
            "samples": [],
        }
        summed: dict[tuple[str, str, str], float] = {}
        for r in self.results.values():
            for s in r.samples:
                if s.spec.name in LOGGED:
                    record["samples"].append([s.spec.name, s.labels, s.value])
                elif s.spec.name in LOGGED_SUMMED:
                    by = LOGGED_SUMMED[s.spec.name]
                    key = (s.spec.name, by, str(s.labels.get(by, "")))
                    summed[key] = summed.get(key, 0.0) + s.value
        record["samples"] += [[name, {by: value}, round(total, 3)] for (name, by, value), total in summed.items()]
        try:
            files.append(self.log_path, json.dumps(record, separators=(",", ":")) + "\n")
        except OSError as e:
            if not self._log_failed:  # once, not at every poll of a full disk
                say(
                    f"kit exporter: metrics log {self.log_path}: {e} (the exporter goes on; polls are not logged "
                    "while this lasts)"
                )
            self._log_failed = True
        else:
            self._log_failed = False

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll_once()

    def start(self) -> None:
        self.poll_once()
        self._thread = threading.Thread(target=self._run, name="kit-poller", daemon=True)
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        self._stop.set()
        if not wait:
            return
        if self._thread:
            self._thread.join(timeout=5)
        for source in self.sources:
            close = getattr(source, "close", None)
            if close:
                close()


class CachedCollector:
    """One source's metrics, from the poller's cache; never raises into a scrape."""

    def __init__(self, poller: Poller, source: str, naming: Naming | None = None):
        self.poller = poller
        self.source = source
        self.naming = naming or Naming()

    def samples(self) -> list[Sample]:
        return self.poller.results[self.source].samples

    def collect(self) -> Iterable[Family]:
        try:
            yield from families(self.samples(), self.naming.metrics, self.naming.labels)
        except Exception as e:  # pragma: no cover - a bug here must not break the scrape
            say(f"kit exporter: collect {self.source} failed: {type(e).__name__}: {e}")


class StatusCollector(CachedCollector):
    """Every source's own success and the duration of its last poll."""

    def __init__(self, poller: Poller):
        super().__init__(poller, "status")

    def samples(self) -> list[Sample]:
        out: list[Sample] = []
        for name, r in sorted(self.poller.results.items()):
            out += [
                Sample(SUCCESS, {"collector": name}, float(r.success)),
                Sample(DURATION, {"collector": name}, r.duration),
            ]
        return out


def target_labels(env: dict, node: str, extra: dict) -> dict:
    labels = {label: env[var] for label, var in JOB_LABELS if env.get(var)}
    if "slurm_user" not in labels and env.get("USER"):
        labels["slurm_user"] = env["USER"]
    labels["node"] = node
    labels.update(extra)
    for bad in RESERVED_LABELS:
        labels.pop(bad, None)
    return labels


def advertise_address(bind: str) -> str:
    """Where Prometheus finds this exporter: the bind address, else the host name's address
    when it is one of this node's own (one can bind it), else the address of the route out,
    else loopback. A node in a network namespace of its own resolves the machine's name to
    an address it does not have."""
    if bind not in ("", "0.0.0.0", "::"):
        return bind
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            addr = info[4][0]
            if not addr.startswith("127.") and _local(addr):
                return addr
    except OSError:
        pass
    try:  # the source address of the default route: connect() on UDP sends nothing
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("198.51.100.1", 9))  # TEST-NET-2: never answered, only routed
            addr = s.getsockname()[0]
            if not addr.startswith(("127.", "0.")):
                return addr
    except OSError:
        pass
    return "127.0.0.1"


def _local(addr: str) -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((addr, 0))
        return True
    except OSError:
        return False


class Exporter:
    def __init__(
        self,
        sources: list,
        *,
        interval: float = 1.0,
        bind: str = "0.0.0.0",
        port: int = 9400,
        port_max: int | None = None,
        targets_dir: Path | None = None,
        labels: dict | None = None,
        log_path: Path | None = None,
        node: str | None = None,
        advertise: str | None = None,
        env: dict | None = None,
        naming: str = "prometheus",
    ):
        self.node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self.poller = Poller(sources, interval, log_path, self.node)
        spelling = Naming(naming)
        # One collector per source, and one for their status.
        self.collectors = [CachedCollector(self.poller, source.name, spelling) for source in sources]
        self.collectors.append(StatusCollector(self.poller))
        self.bind = bind
        self.ports = range(port, (port_max if port_max is not None else port) + 1)
        self.targets_dir = targets_dir
        self.labels = target_labels(env if env is not None else dict(os.environ), self.node, labels or {})
        self.advertise = advertise
        self.port: int | None = None
        self.target_file: Path | None = None
        self._server = None

    def start(self) -> None:
        """Poll, serve, advertise; on any failure nothing is left running or written."""
        try:
            self.poller.start()
            for port in self.ports:
                try:
                    self._server = scrapes.serve(self.bind, port, self.render)
                except OSError:
                    continue  # busy: the next one
                self.port = port
                break
            if self.port is None:
                raise NoPort(f"no free port in {self.ports.start}-{self.ports.stop - 1} on {self.bind}")
            if self.targets_dir is not None:
                self._write_target()
        except BaseException:
            self.stop()
            raise

    def render(self) -> bytes:
        """What a scrape answers: every collector's families, in the text format."""
        return text(fam for collector in self.collectors for fam in collector.collect())

    def _write_target(self) -> None:
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        host = self.advertise or advertise_address(self.bind)
        job = self.labels.get("slurm_job_id", "nojob")
        name = f"kit-{job}-{self.node}-{self.port}.json"
        files.write_atomic(
            self.targets_dir / name,
            json.dumps([{"targets": [f"{host}:{self.port}"], "labels": self.labels}], indent=1) + "\n",
        )
        self.target_file = self.targets_dir / name

    def stop(self, *, last: bool = False) -> None:
        """Unadvertise, stop serving and polling. ``last``: the process ends next, and its threads (daemons)
        with it, unwaited: the HTTP server's shutdown waits out its 0.5 s poll, the poller's join its poll in
        flight (a 64-node job's exporters on one machine took 1-3 s to exit after TERM, one after another at
        their low priority)."""
        if self.target_file is not None:
            try:
                self.target_file.unlink()
            except FileNotFoundError:
                pass
            self.target_file = None
        if self._server is not None and not last:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.poller.stop(wait=not last)

    @staticmethod
    def catch_signals() -> Stop:
        """TERM, INT and HUP set the returned stop instead of killing the process (without a lock: see
        :mod:`kit.stopping`)."""
        return Stop()

    def serve_until(self, done: Stop, parent: int | None = None) -> None:
        """Serve until ``done`` is set, or until ``parent`` is gone (the training ended)."""
        while not done.wait(1.0):
            if parent and os.getppid() != parent:
                break
