"""GPU metrics through NVML, with dcgm-exporter's names, units and labels.

The data source is the ``pynvml`` module (package ``nvidia-ml-py``), passed in
so tests can hand it a fake. Inside a job's cgroup NVML sees only the job's
GPUs: series are labelled by UUID and take ``gpu``/``device`` from the minor
number, so they line up with a host-level dcgm-exporter.

Failure modes are part of the design: no library or no driver makes the
collector report itself down (and retry); an error on one GPU or one field
drops just those values; a driver that goes away mid-run is noticed at the
next poll, and the collector starts over.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, NamedTuple

from kit.monitor.families import Sample, SourceResult, Spec

MIB = 1024 * 1024

# dcgm-exporter's names and units. Those it types as counters keep their exact
# names; they are exposed untyped, since a counter must end in _total.
FIELDS: tuple[tuple[Spec, Callable[[Any, Any], float]], ...] = (
    (
        Spec("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
        lambda n, h: n.nvmlDeviceGetUtilizationRates(h).gpu,
    ),
    (
        Spec("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
        lambda n, h: n.nvmlDeviceGetUtilizationRates(h).memory,
    ),
    (
        Spec("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
        lambda n, h: n.nvmlDeviceGetMemoryInfo(h).used / MIB,
    ),
    (
        Spec("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
        lambda n, h: n.nvmlDeviceGetMemoryInfo(h).free / MIB,
    ),
    (
        Spec("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
        lambda n, h: n.nvmlDeviceGetPowerUsage(h) / 1000.0,
    ),
    (
        Spec("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
        lambda n, h: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
    ),
    (
        Spec("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
        lambda n, h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
    ),
    (
        Spec("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
        lambda n, h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
    ),
    (
        Spec(
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons (bitmask of NVML reasons)."
        ),
        lambda n, h: _reasons(n, h),
    ),
    (
        Spec("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "unknown", "Total number of single-bit volatile ECC errors."),
        lambda n, h: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
    ),
    (
        Spec("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "unknown", "Total number of double-bit volatile ECC errors."),
        lambda n, h: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
    ),
    (
        Spec("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "unknown", "Number of remapped rows for correctable errors."),
        lambda n, h: n.nvmlDeviceGetRemappedRows(h)[0],
    ),
    (
        Spec("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "unknown", "Number of remapped rows for uncorrectable errors."),
        lambda n, h: n.nvmlDeviceGetRemappedRows(h)[1],
    ),
    (
        Spec("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed."),
        lambda n, h: float(bool(n.nvmlDeviceGetRemappedRows(h)[3])),
    ),
)

# NVML clock event (throttle) reasons, one gauge per reason.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
THROTTLE = Spec("gpu_clock_throttle_active", "gauge", "1 while the GPU's clocks are held down for this reason.")
PROCESSES = Spec("gpu_compute_processes", "gauge", "Compute processes running on the GPU (0: held but unused).")
LOST = Spec(
    "gpu_lost",
    "gauge",
    "1 while NVML reports the GPU lost (NVML_ERROR_GPU_IS_LOST: fallen off the bus); "
    "its other values are then missing.",
)
NVML_ERROR_GPU_IS_LOST = 15
XID_LAST = Spec("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.")
XID_COUNT = Spec("gpu_xid_errors_total", "counter", "XID errors seen since the exporter started.")
XID_TIME = Spec("gpu_xid_last_timestamp_seconds", "gauge", "When the last XID error was seen (Unix time).")


def _reasons(n, h) -> int:
    get = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(get(h))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def job_gpus(env) -> set[int] | None:
    """The GPUs Slurm gave this step (``SLURM_STEP_GPUS``, else the job's ``SLURM_JOB_GPUS``),
    as NVML minor numbers (gres.conf's ``File=/dev/nvidia[0-7]`` numbers them alike); None
    outside a GPU job. Where device cgroups hide the others NVML already sees only these;
    where they do not, the exporter serves these alone, so no other job's GPU carries
    this job's labels."""
    text = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS") or ""
    out: set[int] = set()
    for item in filter(None, text.split(",")):
        low, _, high = item.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return None  # not what Slurm writes: every GPU NVML shows, as before
        out.update(range(int(low), int(high or low) + 1))
    return out or None


def _is_lost(error: Exception) -> bool:
    return getattr(error, "value", None) == NVML_ERROR_GPU_IS_LOST


class Device(NamedTuple):
    handle: Any
    labels: dict


class LibraryNotFound(OSError):
    """No NVML library on this node (a CPU node): what the binding would raise, before its import."""


def _library() -> None:
    """Load NVML's library as the binding does (by its soname), or raise :class:`LibraryNotFound`."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        raise LibraryNotFound(f"NVML Shared Library Not Found ({e})") from None


class GpuSource:
    """Polls NVML. ``nvml`` is the pynvml module or a stand-in with its API (None: import pynvml)."""

    name = "gpu"

    def __init__(
        self,
        nvml=None,
        hostname: str = "",
        hostname_label: str = "Hostname",
        events: bool = True,
        minors: set[int] | None = None,
        say=None,
    ):
        self._nvml = nvml
        self._say = say  # a line for the exporter's log (watching XIDs), or None
        self.watching = threading.Event()  # set once the XID thread has registered its GPUs
        self.minors = minors  # serve only these GPUs (the job's: job_gpus); None: every one
        self.hostname = hostname
        self.hostname_label = hostname_label
        self.devices: list[Device] | None = None
        self._xid: dict[str, tuple[int, int, float]] = {}  # uuid -> (last xid, count, time)
        self._lock = threading.Lock()
        self._events = events
        self._event_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._retry_at = 0.0
        self._last_error = ""
        self._was_up: bool | None = None  # after a success, the first failure retries at once

    @property
    def nvml(self):
        if self._nvml is None:
            _library()  # where there is none, the binding's import (22 ms of CPU) is not paid at every retry
            import pynvml  # nvidia-ml-py

            self._nvml = pynvml
        return self._nvml

    def _init(self) -> None:
        n = self.nvml
        n.nvmlInit()
        devices = []
        for i in range(n.nvmlDeviceGetCount()):
            h = None
            try:
                h = n.nvmlDeviceGetHandleByIndex(i)
                minor = n.nvmlDeviceGetMinorNumber(h)
                labels = {
                    "gpu": str(minor),
                    "UUID": _text(n.nvmlDeviceGetUUID(h)),
                    "pci_bus_id": _text(n.nvmlDeviceGetPciInfo(h).busId),
                    "device": f"nvidia{minor}",
                    "modelName": _text(n.nvmlDeviceGetName(h)),
                }
            except Exception as e:  # one GPU that cannot be read does not hide the others
                if not _is_lost(e):
                    continue
                # Lost before it could be named: served by its index, as lost (no UUID to give).
                minor = i
                labels = {"gpu": str(i), "UUID": "", "pci_bus_id": "", "device": f"nvidia{i}", "modelName": ""}
            if self.hostname_label:
                labels[self.hostname_label] = self.hostname
            devices.append(Device(h, labels))
        mine = [d for d in devices if self.minors is None or int(d.labels["gpu"]) in self.minors]
        if not mine and self.minors is not None and len(devices) == len(self.minors):
            # A device cgroup already shows NVML the job's GPUs alone, numbered otherwise than
            # Slurm's indexes: they are the job's.
            mine = devices
        self.devices = mine
        if self._events and self._event_thread is None:
            self._event_thread = threading.Thread(target=self._watch_xids, name="kit-xid", daemon=True)
            self._event_thread.start()

    def reset(self) -> None:
        self.devices = None
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass

    def close(self) -> None:
        self._stop.set()
        self.reset()

    RETRY_SECONDS = 30.0  # how long a down source waits before trying NVML again

    def poll(self) -> SourceResult:
        t0 = time.perf_counter()
        if self.devices is None and time.monotonic() < self._retry_at:
            return SourceResult([], False, 0.0, self._last_error)
        try:
            if self.devices is None:
                self._init()
            # A driver that went away fails here, for the whole source.
            self.nvml.nvmlDeviceGetCount()
            samples = []
            for dev in self.devices:
                samples += self._device_samples(dev)
            self._was_up = True
            return SourceResult(samples, True, time.perf_counter() - t0)
        except Exception as e:  # no library, no driver, driver gone: down, retried after a pause
            self.reset()
            self._last_error = f"{type(e).__name__}: {e}"
            self._retry_at = time.monotonic() + (0.0 if self._was_up else self.RETRY_SECONDS)
            self._was_up = False
            return SourceResult([], False, time.perf_counter() - t0, self._last_error)

    def _device_samples(self, dev: Device) -> list[Sample]:
        n = self.nvml
        out = []
        reasons = None
        lost = dev.handle is None
        for spec, read in FIELDS:
            if lost:
                break
            try:
                value = read(n, dev.handle)
            except Exception as e:  # not supported on this GPU, or a per-GPU error
                lost = _is_lost(e)
                continue
            out.append(Sample(spec, dev.labels, value))
            if spec.name == "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS":
                reasons = int(value)
        # kit's own GPU metrics follow Prometheus naming: no camelCase modelName label.
        own = {k: v for k, v in dev.labels.items() if k != "modelName"}
        if reasons is not None:
            for bit, reason in THROTTLE_REASONS:
                out.append(Sample(THROTTLE, {**own, "reason": reason}, float(bool(reasons & bit))))
        out.append(Sample(LOST, own, float(lost)))
        try:
            if not lost:
                out.append(Sample(PROCESSES, own, float(len(n.nvmlDeviceGetComputeRunningProcesses(dev.handle)))))
        except Exception:  # not supported, or a per-GPU error
            pass
        with self._lock:
            last, count, when = self._xid.get(dev.labels["UUID"], (0, 0, 0.0))
        out.append(Sample(XID_LAST, dev.labels, last))
        out.append(Sample(XID_COUNT, own, count))
        if when:
            out.append(Sample(XID_TIME, own, when))
        return out

    def _watch_xids(self) -> None:
        """NVML's event API, in its own thread: XID errors as they happen."""
        n = self.nvml
        try:
            event_set = n.nvmlEventSetCreate()
            by_handle = {}
            for dev in self.devices or []:
                try:
                    n.nvmlDeviceRegisterEvents(dev.handle, n.nvmlEventTypeXidCriticalError, event_set)
                    by_handle[id(dev.handle)] = dev
                except Exception:  # the GPU does not support events
                    continue
        except Exception:
            return
        self.watching.set()  # NVML gives an event set only what happens from now on
        if self._say:
            self._say(f"watching XID events on {len(by_handle)} GPU(s)")
        while not self._stop.is_set():
            try:
                event = n.nvmlEventSetWait_v2(event_set, 500)
            except Exception as e:
                if "Timeout" in type(e).__name__ or "TIMEOUT" in str(e).upper():
                    continue
                time.sleep(0.5)
                continue
            try:
                uuid = _text(n.nvmlDeviceGetUUID(event.device))
            except Exception:  # the GPU went away with its event
                continue
            with self._lock:
                _, count, _ = self._xid.get(uuid, (0, 0, 0.0))
                self._xid[uuid] = (int(event.eventData), count + 1, time.time())
