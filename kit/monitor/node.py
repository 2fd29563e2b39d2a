"""Node metrics through psutil, with node_exporter's names (switch off where one runs)."""

from __future__ import annotations

import os
import re
import time

from kit.monitor.families import Sample, SourceResult, Spec

CPU = Spec("node_cpu_seconds_total", "counter", "Seconds the CPUs spent in each mode.")
MEM_TOTAL = Spec("node_memory_MemTotal_bytes", "gauge", "Memory information field MemTotal_bytes.")
MEM_AVAILABLE = Spec("node_memory_MemAvailable_bytes", "gauge", "Memory information field MemAvailable_bytes.")
NET_RX = Spec("node_network_receive_bytes_total", "counter", "Network device statistic receive_bytes.")
NET_TX = Spec("node_network_transmit_bytes_total", "counter", "Network device statistic transmit_bytes.")
DISK_R = Spec("node_disk_read_bytes_total", "counter", "The total number of bytes read successfully.")
DISK_W = Spec("node_disk_written_bytes_total", "counter", "The total number of bytes written successfully.")
LOADS = (
    Spec("node_load1", "gauge", "1m load average."),
    Spec("node_load5", "gauge", "5m load average."),
    Spec("node_load15", "gauge", "15m load average."),
)
# node_exporter's default --collector.diskstats.device-exclude: no partitions, loop or RAM devices.
DISK_EXCLUDE = re.compile(r"^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$")
CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


class PsutilSource:
    """A source that reads psutil, imported at the first poll (tests hand in a stand-in)."""

    def __init__(self, psutil=None):
        self._psutil = psutil

    @property
    def psutil(self):
        if self._psutil is None:
            import psutil

            self._psutil = psutil
        return self._psutil


class NodeSource(PsutilSource):
    name = "node"

    def poll(self) -> SourceResult:
        t0 = time.perf_counter()
        try:
            ps = self.psutil
            out = []
            for cpu, times in enumerate(ps.cpu_times(percpu=True)):
                for mode in CPU_MODES:
                    if hasattr(times, mode):
                        out.append(Sample(CPU, {"cpu": str(cpu), "mode": mode}, getattr(times, mode)))
            vm = ps.virtual_memory()
            out += [Sample(MEM_TOTAL, {}, vm.total), Sample(MEM_AVAILABLE, {}, vm.available)]
            for dev, c in sorted((ps.net_io_counters(pernic=True) or {}).items()):
                out += [Sample(NET_RX, {"device": dev}, c.bytes_recv), Sample(NET_TX, {"device": dev}, c.bytes_sent)]
            for dev, c in sorted((ps.disk_io_counters(perdisk=True) or {}).items()):
                if DISK_EXCLUDE.match(dev):
                    continue
                out += [Sample(DISK_R, {"device": dev}, c.read_bytes), Sample(DISK_W, {"device": dev}, c.write_bytes)]
            for spec, value in zip(LOADS, os.getloadavg()):
                out.append(Sample(spec, {}, value))
            return SourceResult(out, True, time.perf_counter() - t0)
        except Exception as e:
            return SourceResult([], False, time.perf_counter() - t0, f"{type(e).__name__}: {e}")
