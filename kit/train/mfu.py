"""Model FLOPs on the training side: a step's FLOPs counted once, the achieved TFLOP/s of this rank's device
over each metrics write, and MFU against :mod:`kit.monitor.peaks` for the name NVML gives the device.

What counts: the model's own arithmetic, as ``torch.utils.flop_counter`` counts the forward pass (under
no_grad: no side effect on the training), times 3 (the backward pass does twice the forward's matmuls: the
ratio of the 6·N·tokens rule); recomputation (gradient checkpointing) and the optimizer are not counted.
Any script can pass its own count to :func:`kit.train.progress.step` (``flops=``).
"""

from __future__ import annotations

import os
import sys

HOW = "torch.utils.flop_counter on the forward pass, x 3 for forward + backward"


def flops_per_step(model, batch) -> int:
    """FLOPs of one training step of ``model`` on ``batch`` (this rank's share), counted as :data:`HOW`."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    x = batch[0] if isinstance(batch, (list, tuple)) else batch
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x)
    return 3 * int(counter.get_total_flops())


def nvml_name(device: str) -> str | None:
    """NVML's name of a GPU given as CUDA_VISIBLE_DEVICES gives it (an index or a ``GPU-…`` UUID)."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:  # no NVML on this machine
        return None
    text = lambda value: value.decode() if isinstance(value, bytes) else str(value)  # noqa: E731
    try:
        if device.isdigit():
            return text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(int(device))))
        for i in range(pynvml.nvmlDeviceGetCount()):  # a UUID: the GPU that has it (a MIG instance: none)
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            if device.startswith(text(pynvml.nvmlDeviceGetUUID(h))):
                return text(pynvml.nvmlDeviceGetName(h))
        return None
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def device_name(device: object = None) -> str | None:
    """NVML's name of the CUDA device this process trains on: ``device`` (torch's device, or its text:
    ``"cuda:1"``, ``"cpu"``), else torch's current CUDA device; None on any other device or where CUDA is
    not there (MFU is then "n/a": a script that trains on the CPU of a GPU node is not measured against the
    GPU). torch must already be imported by the caller (this module never imports it)."""
    torch = sys.modules.get("torch")
    kind, _, number = str(device if device is not None else "cuda").partition(":")
    if kind != "cuda" or torch is None or not torch.cuda.is_available():
        return None
    index = int(number) if number.isdigit() else torch.cuda.current_device()
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    physical = visible[index] if index < len(visible) else str(index)
    return nvml_name(physical) or torch.cuda.get_device_name(index)


class Throughput:
    """This rank's achieved TFLOP/s between two metrics writes, and its MFU (None: n/a)."""

    def __init__(self, flops_per_step: float | None = None, precision: str | None = None, gpu_name: str | None = None):
        self.flops_per_step, self.precision, self.gpu_name = flops_per_step, precision, gpu_name
        self.flops = 0.0

    def step(self, flops: float | None = None) -> None:
        """One step done (``flops``: its own count, else :attr:`flops_per_step`)."""
        f = self.flops_per_step if flops is None else flops
        if f:
            self.flops += f

    def values(self, seconds: float) -> dict:
        """``tflops`` (and ``mfu`` when known) over the last ``seconds``; the count restarts."""
        from kit.monitor import peaks

        flops, self.flops = self.flops, 0.0
        if not flops or seconds <= 0:
            return {}
        tflops = flops / seconds / 1e12
        out = {"tflops": tflops}
        mfu = peaks.mfu(tflops, self.gpu_name, self.precision)
        if mfu is not None:
            out["mfu"] = mfu
        return out
