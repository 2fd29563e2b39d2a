"""GPUs for tests, behind the real NVML binding: tests/libnvml/nvml.c built as
``libnvidia-ml.so.1`` (what nvidia-ml-py loads through ctypes), its GPUs written to a
state file that the library re-reads on every call (see the C file for the format).

    gpus = FakeGpus(tmp_path / "nvml-state")      # 8 H100-like GPUs, as a node has
    gpus.set(3, util=90); gpus.fail(2, "nvmlDeviceGetPowerUsage", NOT_SUPPORTED)
    gpus.xid(5, 79); gpus.lose(1); gpus.write()
    env = gpus.env()                              # LD_LIBRARY_PATH and the state file, for a process
    preload(); os.environ.update(gpus.env())      # in this process: pynvml finds it by its soname
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "libnvml" / "nvml.c"
NOT_SUPPORTED, GPU_IS_LOST, UNKNOWN = 3, 15, 999
GIB = 1024**3


def build(directory: Path | None = None) -> Path:
    """The library, compiled once per source text (gcc comes with .ci/setup)."""
    text = SOURCE.read_bytes()
    directory = directory or Path(os.environ.get("FAKE_NVML_BUILD", "/tmp/kit-fake-nvml"))
    out = directory / hashlib.sha256(text).hexdigest()[:16] / "libnvidia-ml.so.1"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            tmp = out.with_name(f".{out.name}.{os.getpid()}")
            subprocess.run(
                [
                    "gcc",
                    "-shared",
                    "-fPIC",
                    "-O2",
                    "-Wall",
                    "-Werror",
                    "-o",
                    str(tmp),
                    "-pthread",
                    "-Wl,-soname,libnvidia-ml.so.1",
                    str(SOURCE),
                ],
                check=True,
            )
            os.replace(tmp, out)
    return out


_preloaded: ctypes.CDLL | None = None


def preload() -> Path:
    """Load the library into this process, so that pynvml's ``CDLL("libnvidia-ml.so.1")``
    finds it (the dynamic loader matches a loaded library by its soname)."""
    global _preloaded
    lib = build()
    if _preloaded is None:
        _preloaded = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    return lib


def default_gpu(i: int) -> dict:
    return dict(
        name="NVIDIA_H100_80GB_HBM3",
        uuid=f"GPU-{i:08d}-fake",
        bus=f"00000000:{0x10 + i:02X}:00.0",
        util=10 * i,
        memutil=5 * i,
        total=80 * GIB,
        used=(i + 1) * GIB,
        power=100_000 + 1000 * i,
        temp=40 + i,
        sm=1980,
        mem=2619,
        reasons=0x4 if i == 3 else 0x1,
        sbe=i,
        dbe=0,
        remap_corr=i,
        remap_unc=0,
        remap_pending=0,
        remap_fail=0,
        procs=f"{1000 + i}:{GIB}",
    )


class FakeGpus:
    """The state file of one node's GPUs."""

    def __init__(self, path: Path, count: int = 8, minors: list[int] | None = None):
        self.path = Path(path)
        minors = minors if minors is not None else list(range(count))
        self.gpus = {m: default_gpu(m) for m in minors}
        self.fails: list[tuple[int, str, int]] = []
        self.lost: set[int] = set()
        self.xids: list[tuple[int, int, int]] = []
        self.driver = "ok"
        self.write()

    def set(self, minor: int, **values) -> FakeGpus:
        self.gpus[minor].update(values)
        return self

    def processes(self, minor: int, pids: list[int], used: int = GIB) -> FakeGpus:
        self.gpus[minor]["procs"] = ",".join(f"{p}:{used}" for p in pids)
        return self

    def fail(self, minor: int, function: str, code: int = NOT_SUPPORTED) -> FakeGpus:
        self.fails.append((minor, function, code))
        return self

    def lose(self, minor: int) -> FakeGpus:
        self.lost.add(minor)
        return self

    def xid(self, minor: int, value: int) -> FakeGpus:
        self.xids.append((minor, value, len(self.xids) + 1))
        return self.write()

    def text(self) -> str:
        lines = [f"driver {self.driver}"]
        for minor, values in self.gpus.items():
            words = " ".join(f"{k}={v}" for k, v in values.items() if v != "")
            lines.append(f"gpu {minor} {words}")
        lines += [f"fail {m} {fn} {code}" for m, fn, code in self.fails]
        lines += [f"lost {m}" for m in sorted(self.lost)]
        lines += [f"xid {m} {v} {seq}" for m, v, seq in self.xids]
        return "\n".join(lines) + "\n"

    def write(self) -> FakeGpus:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(self.text())
        os.replace(tmp, self.path)  # the library never reads half a file
        return self

    def env(self) -> dict[str, str]:
        return {"LD_LIBRARY_PATH": str(build().parent), "FAKE_NVML_STATE": str(self.path)}
