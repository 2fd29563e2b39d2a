"""A short burn-in: matrix products timed on each GPU (bf16, against the peak table) or, on a node without one,
on its CPUs (fp32). A node is judged against the job's other nodes (kit.preflight.verdict), a GPU also against
its datasheet peak (kit.monitor.peaks)."""

from __future__ import annotations

import time

from kit.monitor import peaks

GPU_SIZE, CPU_SIZE = 8192, 512


def _rate(step, flops: float, seconds: float, sync=lambda: None, block: float = 0.05, clock=time.perf_counter) -> float:
    """TFLOP/s of ``step`` (``flops`` each): the best of blocks of about ``block`` seconds of ``clock`` run for about
    ``seconds`` after one warm-up, synchronised once a block. A shared machine's time slices and a GPU's clocks
    still rising from idle lower a mean, not the best block (a GPU synchronised after each product and averaged
    over 2 s read 666 TFLOP/s on an H200 that multiplies at 790); a slow device is slow in every block."""
    t0 = clock()
    step()
    sync()
    n = max(1, int(block / max(clock() - t0, 1e-6)))
    best, end = 0.0, time.perf_counter() + seconds
    while True:
        t0 = clock()
        for _ in range(n):
            step()
        sync()
        elapsed = max(clock() - t0, 1e-9)
        best = max(best, n * flops / elapsed / 1e12)
        if time.perf_counter() >= end:
            return best
        n = max(1, round(n * block / elapsed))  # the next block about ``block`` long


# The burn-in's seconds on a node (a GPU's: half each): the best of ~0.05-0.1 s blocks is steady within one, and
# preflight's whole check of a node (Python, torch's import, NVML, this) stays under 5 s.
SECONDS = 1.0


def burn_in(seconds: float = SECONDS) -> dict:
    """``{"device": "cpu", "tflops": x}`` or ``{"device": "cuda", "gpus": [{"index", "name", "tflops",
    "of_peak"}, ...]}``; ``{"device": None, "why": ...}`` without torch."""
    try:
        import torch
    except ImportError as e:
        return {"device": None, "why": f"no torch here ({e}): no burn-in"}
    if torch.cuda.is_available():
        out = []
        for i in range(torch.cuda.device_count()):
            a = torch.randn(GPU_SIZE, GPU_SIZE, device=f"cuda:{i}", dtype=torch.bfloat16)
            b = torch.randn_like(a)
            rate = _rate(lambda: a @ b, 2.0 * GPU_SIZE**3, seconds / 2, lambda: torch.cuda.synchronize(i), block=0.1)
            name = torch.cuda.get_device_name(i)
            peak = peaks.peak_tflops(name, "bf16")
            out.append({"index": i, "name": name, "tflops": rate, "of_peak": rate / peak if peak else None})
        return {"device": "cuda", "gpus": out}
    return {"device": "cpu", "tflops": cpu_rate(seconds), "threads": 1}


def cpu_rate(seconds: float = SECONDS, clock=time.thread_time) -> float:
    """One core's TFLOP/s (fp32 products, one thread), timed by ``clock``: by default this thread's own CPU time
    (the products run in it), so that a node's cores read alike and a node whose cores other processes share (the
    local cluster's nodes on one host, a busy neighbour) is not a slow node for the time it waited (wall-clock
    blocks read one node at 43 % of the other under load)."""
    import torch

    torch.set_num_threads(1)
    a = torch.randn(CPU_SIZE, CPU_SIZE)
    b = torch.randn_like(a)
    return _rate(lambda: a @ b, 2.0 * CPU_SIZE**3, seconds, clock=clock)
