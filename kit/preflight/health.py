"""A node's GPUs checked before a job's first step, through NVML (no GPU: nothing to check).

Each problem is a :class:`Finding`: ``fail`` keeps the node out of the run, ``warn`` is told. What fails:
a GPU Slurm allocated that NVML does not see, a lost GPU (fallen off the bus), volatile double-bit ECC errors,
row remapping pending (the GPU needs a reset) or failed, a hardware slowdown holding the clocks down, and an Xid
that means the GPU needs a reset or the node draining (:data:`FATAL_XIDS`). Xids come from NVML's events while the
check runs (the burn-in included) and, where this user may read it, the kernel log since boot (``NVRM: Xid``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from kit.monitor.gpu import NVML_ERROR_GPU_IS_LOST, job_gpus

# NVIDIA's Xid catalogue: the errors after which a GPU is reset or the node drained (double-bit ECC, row
# remapping, NVLink, fallen off the bus, high single-bit rate, contained/uncontained ECC, GSP, unrecovered ECC).
FATAL_XIDS = {
    48: "double-bit ECC error",
    63: "row remapping",
    64: "row remapping failure",
    74: "NVLink error",
    79: "fallen off the bus",
    92: "high single-bit ECC rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
HW_SLOWDOWN = {0x8: "hardware slowdown", 0x40: "hardware thermal slowdown", 0x80: "hardware power brake"}
SW_THERMAL = 0x20
EVENT_WAIT_MS = 200
_KMSG_XID = re.compile(rb"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")


@dataclass(frozen=True)
class Finding:
    level: str  # fail | warn | info
    what: str
    gpu: int | None = None  # the GPU's minor number

    def line(self) -> str:
        return f"{self.level.upper()}: " + (f"GPU {self.gpu}: " if self.gpu is not None else "") + self.what


def _nvml():
    import pynvml

    return pynvml


def _lost(error: Exception) -> bool:
    return getattr(error, "value", None) == NVML_ERROR_GPU_IS_LOST


def _call(fn, *args):
    """NVML's answer, or None where the GPU or driver does not support the call."""
    try:
        return fn(*args)
    except Exception as e:  # NotSupported, FunctionNotFound (an older driver): not a finding
        if _lost(e):
            raise
        return None


def check_gpus(
    env: dict | None = None, during=lambda: None, say=lambda line: None
) -> tuple[list[Finding], list[dict], Any]:
    """(findings, the GPUs seen: minor, name, bus id, what ``during`` returned) for this node's allocated GPUs
    (all NVML sees outside a GPU job). ``during`` (the burn-in) runs while NVML's Xid events are listened to,
    unless a GPU failed already; ``say`` hears when the listening began."""
    env = os.environ if env is None else env
    allocated = job_gpus(env)
    try:
        n = _nvml()
    except ImportError as e:  # the image lacks the binding: no node's fault, nothing checked
        say("no NVML binding")
        return [Finding("warn", f"nvidia-ml-py is not installed here ({e}): no GPU checked")], [], during()
    try:
        n.nvmlInit()
    except Exception as e:
        say("no NVML")
        if allocated:
            return [Finding("fail", f"{len(allocated)} GPU(s) allocated but NVML does not start: {e}")], [], None
        return [Finding("info", f"no NVML on this node ({type(e).__name__}): no GPU checked")], [], during()
    try:
        return _check(n, allocated, during, say)
    finally:
        _call(n.nvmlShutdown)


def _check(n, allocated: set[int] | None, during, say) -> tuple[list[Finding], list[dict], Any]:
    findings, seen, handles = [], [], {}
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        try:
            minor = int(n.nvmlDeviceGetMinorNumber(h))
        except Exception as e:
            if _lost(e):
                findings.append(Finding("fail", f"GPU at index {i} is lost (fallen off the bus)"))
            continue
        if allocated is None or minor in allocated:
            handles[minor] = h
    if not findings:  # (a GPU lost before its minor was read is the unseen one: named once, above)
        for minor in sorted((allocated or set()) - set(handles)):
            findings.append(Finding("fail", "allocated by Slurm but NVML does not see it", minor))
    for minor, h in sorted(handles.items()):
        try:
            findings += _gpu_findings(n, h, minor)
            name = _call(n.nvmlDeviceGetName, h)
            bus = _call(n.nvmlDeviceGetPciInfo, h)
            seen.append({"minor": minor, "name": _text(name), "bus": _text(getattr(bus, "busId", "")) or None})
        except Exception as e:
            if not _lost(e):
                raise
            findings.append(Finding("fail", "lost (fallen off the bus): NVML_ERROR_GPU_IS_LOST", minor))
    event_set = _listen(n, handles)
    say(f"listening for Xids on {len(handles)} GPU(s)")
    done = during() if not any(f.level == "fail" for f in findings) else None
    findings += _xids(n, handles, event_set)
    return findings, seen, done


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def _gpu_findings(n, h, minor: int) -> list[Finding]:
    out = []
    dbe = _call(n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)
    if dbe:
        out.append(Finding("fail", f"{dbe} volatile double-bit ECC error(s) since the driver loaded", minor))
    rows = _call(n.nvmlDeviceGetRemappedRows, h)
    if rows:
        _, _, pending, failed = rows
        if pending:
            out.append(Finding("fail", "row remapping pending: the GPU needs a reset", minor))
        if failed:
            out.append(Finding("fail", "row remapping failed: the GPU needs service", minor))
    get = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
    reasons = _call(get, h) or 0
    for bit, what in HW_SLOWDOWN.items():
        if reasons & bit:
            out.append(Finding("fail", f"clocks held down: {what}", minor))
    if reasons & SW_THERMAL:
        out.append(Finding("warn", "clocks held down: software thermal slowdown (the GPU runs hot)", minor))
    limit, default = _call(n.nvmlDeviceGetEnforcedPowerLimit, h), _call(n.nvmlDeviceGetPowerManagementDefaultLimit, h)
    if limit and default and limit < 0.9 * default:
        out.append(Finding("warn", f"power capped at {limit / 1000:.0f} W of its {default / 1000:.0f} W", minor))
    return out


def _listen(n, handles: dict):
    """An event set for the GPUs' critical Xids (NVML delivers only what happens from now on); None without."""
    try:
        event_set = n.nvmlEventSetCreate()
    except Exception:
        return None
    for h in handles.values():
        _call(n.nvmlDeviceRegisterEvents, h, n.nvmlEventTypeXidCriticalError, event_set)
    return event_set


def _xids(n, handles: dict, event_set) -> list[Finding]:
    """The Xids NVML delivered since :func:`_listen`, and the kernel log's since boot (where readable)."""
    found: dict[tuple[int | None, int], str] = {}
    if event_set is not None:
        minors = {_text(_call(n.nvmlDeviceGetUUID, h)): minor for minor, h in handles.items()}
        for _ in range(64):
            try:
                event = n.nvmlEventSetWait_v2(event_set, EVENT_WAIT_MS)
            except Exception:
                break  # a timeout: nothing more pending
            uuid = _text(_call(n.nvmlDeviceGetUUID, event.device))
            found[(minors.get(uuid), int(event.eventData))] = "NVML event"
        _call(n.nvmlEventSetFree, event_set)
    for bus, xid in kernel_xids():
        found.setdefault((None, xid), f"kernel log, PCI {bus}")
    out = []
    for (minor, xid), source in sorted(found.items(), key=lambda x: (x[0][0] is None, x[0])):
        meaning = FATAL_XIDS.get(xid)
        level, what = ("fail", f"Xid {xid} ({meaning})") if meaning else ("warn", f"Xid {xid}")
        out.append(Finding(level, f"{what}: {source}", minor))
    return out


def kernel_xids(path: str = "/dev/kmsg") -> list[tuple[str, int]]:
    """(PCI bus, Xid) of every ``NVRM: Xid`` line in the kernel's log since boot; [] where this user may not read
    it (``kernel.dmesg_restrict``) or there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    out = []
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break  # the end of the ring buffer
            except OSError:
                continue  # EPIPE: a record overwritten while reading; the next one follows
            if not record:
                break
            out += [(m.group(1).decode(), int(m.group(2))) for m in _KMSG_XID.finditer(record)]
    finally:
        os.close(fd)
    return out
