"""What kit's watching costs a training step, measured side by side in one training process (bench/gpu_check.py's
steps 6 and 7; its --cpu-path runs both with a tiny GPT on the CPU).

Each alternates two states every ``window`` seconds while a GPT trains and times every step end to end (the GPU
synchronised by the loss's read); the cost is the median step in one state over the median in the other, less one.
Alternating, not one run after the other, keeps a GPU's clocks and temperature out of the comparison.
"""

from __future__ import annotations

import signal
import statistics
import threading
import time
from pathlib import Path

from common import free_port, scrape, start_exporter

TINY = dict(vocab=256, d_model=64, layers=2, heads=4, seq=64, batch=8)
GPT_09B = dict(vocab=50304, d_model=2048, layers=16, heads=16, seq=2048, batch=8)  # 0.9 B parameters


def _gpt(small: bool):
    from kit.train.gpt import GPT

    return GPT(**(TINY if small else GPT_09B)).to("cpu" if small else "cuda")


def _train_step(model, module, opt, small: bool) -> float:
    """One step of ``model`` (``module`` itself, or a DDP around it): bf16 on the GPU; the loss (read: a sync)."""
    import torch

    with torch.autocast("cpu" if small else "cuda", dtype=torch.bfloat16, enabled=not small):
        x, y = module.tokens()
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def _alternate(step, switch, seconds: float, window: float) -> tuple[dict[bool, list[float]], int]:
    """``step(state)`` timed for ``seconds``, ``state`` flipping every ``window`` seconds (``switch(state)`` at each
    flip, between steps); the first 3 steps (warming up) left out. (times per state, steps made)."""
    state, switched, made = True, time.perf_counter(), 0
    times: dict[bool, list[float]] = {True: [], False: []}
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if time.perf_counter() - switched >= window:
            state, switched = not state, time.perf_counter()
            switch(state)
        t0 = time.perf_counter()
        step(state)
        made += 1
        if made > 3:
            times[state].append(time.perf_counter() - t0)
    return times, made


def _cost(times: dict[bool, list[float]], made: int, seconds: float, window: float, on: str, off: str):
    """(the cost: median with over median without, less one; the lines that say it), or (None, why)."""
    if not times[True] or not times[False]:
        return None, [f"  too few steps to compare: {len(times[True])} {on}, {len(times[False])} {off}"]
    a, b = statistics.median(times[True]), statistics.median(times[False])
    return a / b - 1, [
        f"  {made} steps in {seconds:.0f} s, switched every {window:.0f} s: median step {1e3 * a:.2f} ms {on} "
        f"({len(times[True])} steps), {1e3 * b:.2f} ms {off} ({len(times[False])})"
    ]


def exporter_cost(tmp: Path, seconds: float = 60.0, window: float = 3.0, small: bool = False) -> tuple[bool, list[str]]:
    """Step 6: the exporter — NVML, the node and the training files polled every second, scraped every
    second — runs and is stopped (SIGSTOP) in turn while the GPT trains, its metrics file written every second as
    kit.train's callback does (target <= 1 %). ``small``: a tiny GPT on the CPU (the suite's check of this path)."""
    import torch

    from kit.monitor import training

    model = _gpt(small)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    metrics_dir = tmp / "exporter-cost"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = ("--training-dir", str(metrics_dir)) + (("--no-gpu",) if small else ())
    exporter = start_exporter(port, tmp / "exporter-cost.log", gpus=not small, args=args)
    running, stop, written = [True], threading.Event(), [0.0, 0]

    def scraper() -> None:
        while not stop.wait(1.0):
            if running[0]:
                try:
                    scrape(port)
                except OSError:
                    pass

    def step(_: bool) -> None:
        loss = _train_step(model, model, opt, small)
        written[1] += 1
        if time.perf_counter() - written[0] >= 1.0:
            values = {"step": written[1], "loss": loss, "last_step_timestamp_seconds": time.time()}
            training.write(metrics_dir, 0, values)
            written[0] = time.perf_counter()

    def switch(on: bool) -> None:
        exporter.send_signal(signal.SIGCONT if on else signal.SIGSTOP)
        running[0] = on

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        times, made = _alternate(step, switch, seconds, window)
    finally:
        stop.set()
        exporter.send_signal(signal.SIGCONT)
        exporter.terminate()
        exporter.wait(10)
        thread.join(5)
    cost, lines = _cost(times, made, seconds, window, "with the exporter", "without")
    if cost is None:
        return False, lines
    return small or cost <= 0.01, lines + [f"  the exporter's cost: {100 * cost:+.2f} % of a step (target <= 1 %)"]


def straggler_cost(seconds: float = 60.0, window: float = 3.0, small: bool = False) -> tuple[bool, list[str]]:
    """Step 7: the straggler measurement (kit.train.stragglers' communication hook, CUDA events on the
    last bucket) against DDP's own all-reduce: two copies of the GPT, each in a one-rank DDP (NCCL; gloo on the
    CPU), one watched, trained in turn (target <= 1 %); and the watcher read every watched step back."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from kit.train import stragglers

    dist.init_process_group(
        "gloo" if small else "nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        models = {}
        for watched in (True, False):
            module = _gpt(small)
            ddp = DistributedDataParallel(module, device_ids=None if small else [0])
            if watched and stragglers.watch(ddp) is None:
                return False, ["  kit.train.stragglers.watch registered no hook"]
            models[watched] = (ddp, module, torch.optim.AdamW(ddp.parameters(), lr=1e-4))
        stragglers.values()
        times, made = _alternate(lambda on: _train_step(*models[on], small), lambda on: None, seconds, window)
        if not small:
            torch.cuda.synchronize()
        seen = stragglers.values()
    finally:
        dist.destroy_process_group()
    cost, lines = _cost(times, made, seconds, window, "watched", "with DDP's own all-reduce")
    if cost is None:
        return False, lines
    watched_steps = len(times[True])  # timed; the warm-up steps may add a few
    counted = int(seen.get("collective_steps", 0))
    lines += [
        f"  the watcher read {counted} steps back (the watched model made {watched_steps} timed ones), mean wait "
        f"{1e3 * seen.get('collective_wait_seconds', float('nan')):.3f} ms (one rank: the all-reduce alone)",
        f"  the measurement's cost: {100 * cost:+.2f} % of a step (target <= 1 %)",
    ]
    return counted >= watched_steps and (small or cost <= 0.01), lines
