"""``import pynvml`` for a job's exporter in the tests: the fake NVML of
tests/fake_nvml.py as a module (put this directory first on PYTHONPATH).

``FAKE_NVML_GPUS`` sets the count, ``FAKE_NVML_UTIL`` (``80,0``) each GPU's
utilisation and ``FAKE_NVML_PROCESSES`` (``1,0``) its compute processes.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import fake_nvml  # noqa: E402

_nvml = fake_nvml.FakeNVML(int(os.environ.get("FAKE_NVML_GPUS", "2")))
for _key, _attr in (("FAKE_NVML_UTIL", "util"), ("FAKE_NVML_PROCESSES", "processes")):
    for _gpu, _value in zip(_nvml.gpus, filter(None, os.environ.get(_key, "").split(","))):
        setattr(_gpu, _attr, int(_value))

NVMLError = fake_nvml.NVMLError


def __getattr__(name):
    return getattr(_nvml, name)
