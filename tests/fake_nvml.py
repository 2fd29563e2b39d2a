"""A fake of the pynvml API for 8 GPUs (the only fake the tests use: there is no GPU here).

Set ``broken`` (uuid -> field names that raise), ``driver_gone`` (every call
raises as when the driver is unloaded), ``missing`` (init fails as when
libnvidia-ml.so is absent), and push XID events with :meth:`xid`.
"""

from __future__ import annotations

import queue
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class FakeNVML:
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, count: int = 8):
        self.count = count
        self.broken: dict[str, set[str]] = {}
        self.driver_gone = False
        self.missing = False
        self.init_calls = 0
        self.events: queue.Queue = queue.Queue()
        self.gpus = [self._gpu(i) for i in range(count)]

    @staticmethod
    def _gpu(i: int) -> SimpleNamespace:
        return SimpleNamespace(
            index=i, minor=i, uuid=f"GPU-{i:08d}-fake", bus=f"00000000:{0x10 + i:02X}:00.0", name="NVIDIA H100 80GB HBM3",
            util=10 * i, mem_util=5 * i, used=(i + 1) * 1024 * 1024 * 1024, free=80 * 1024 ** 3 - (i + 1) * 1024 ** 3,
            power_mw=100_000 + 1000 * i, temp=40 + i, sm=1980, mem_clock=2619, reasons=0x4 if i == 3 else 0x1,
            sbe=i, dbe=0, remapped=(i, 0, False, False), processes=1)

    # -- failure switches
    def _check(self, gpu=None, field: str = "") -> None:
        if self.driver_gone:
            raise NVMLError_DriverNotLoaded("Driver Not Loaded")
        if gpu is not None and field in self.broken.get(gpu.uuid, set()):
            raise NVMLError("Unknown Error")

    # -- API
    def nvmlInit(self):
        self.init_calls += 1
        if self.missing:
            raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")
        self._check()

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        self._check()
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        self._check()
        return self.gpus[i]

    def nvmlDeviceGetMinorNumber(self, h):
        self._check(h, "minor")
        return h.minor

    def nvmlDeviceGetUUID(self, h):
        return h.uuid

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=h.bus.encode())

    def nvmlDeviceGetName(self, h):
        return h.name

    def nvmlDeviceGetUtilizationRates(self, h):
        self._check(h, "util")
        return SimpleNamespace(gpu=h.util, memory=h.mem_util)

    def nvmlDeviceGetMemoryInfo(self, h):
        self._check(h, "memory")
        return SimpleNamespace(used=h.used, free=h.free, total=h.used + h.free)

    def nvmlDeviceGetPowerUsage(self, h):
        self._check(h, "power")
        return h.power_mw

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._check(h, "temp")
        return h.temp

    def nvmlDeviceGetClockInfo(self, h, clock):
        self._check(h, "clock")
        return h.sm if clock == self.NVML_CLOCK_SM else h.mem_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        self._check(h, "reasons")
        return h.reasons

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        self._check(h, "ecc")
        if h.index == 7:
            raise NVMLError_NotSupported("Not Supported")
        return h.sbe if kind == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else h.dbe

    def nvmlDeviceGetRemappedRows(self, h):
        self._check(h, "remap")
        return h.remapped

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._check(h, "processes")
        return [SimpleNamespace(pid=1000 + n, usedGpuMemory=h.used) for n in range(h.processes)]

    def nvmlEventSetCreate(self):
        return object()

    def nvmlDeviceRegisterEvents(self, h, kinds, event_set):
        pass

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError_Timeout("Timeout") from None

    def xid(self, gpu: int, code: int) -> None:
        self.events.put(SimpleNamespace(device=self.gpus[gpu], eventData=code,
                                        eventType=self.nvmlEventTypeXidCriticalError))
