"""How late each rank arrives at the gradient all-reduce (a straggler's mark), measured on the rank.

Under synchronous data parallelism every rank leaves the gradient all-reduce together, so step times are alike
and say nothing; who arrives last does. A DDP communication hook (:func:`watch`) averages the gradients as DDP's
default does and, on each step's last bucket, times this rank's wait: from its gradients being ready (the end of
its backward pass) to the all-reduce's end, and the waits in the step's other synchronous collectives
(:data:`COLLECTIVES`). The slow rank waits for no one; the others wait for it. Each metrics
write (kit.train's callback, :func:`kit.train.progress.step`) adds this rank's mean wait per step and its mean step
time over the interval (:func:`values`); the first node's exporter judges the ranks (kit.monitor.judges).

On a GPU the wait is timed by CUDA events on the streams (the host runs ahead of the device), read once they have
passed; on a CPU (gloo) by the host's clock. No extra collective, nothing synchronised.

Lightning: ``MetricsCallback`` registers it at the start of training (kit.train does). A plain DDP script:
``kit.train.stragglers.watch(ddp_model)`` once, before the first backward pass, then ``progress.step(...)``.
"""

from __future__ import annotations

import time

_WATCHER: list = []  # the process's watcher, once one is registered


class Watcher:
    """This rank's waits at the all-reduce since the last :meth:`take`."""

    def __init__(self, cuda: bool, group=None):
        import torch.distributed as dist

        self.cuda = cuda
        self.group = group or dist.group.WORLD  # the DDP module's process group
        self.size = self.group.size()
        self.opts = dist.AllreduceOptions()  # a sum; NCCL averages itself (one kernel less a bucket)
        self.average = dist.get_backend(self.group) == "nccl"
        if self.average:
            self.opts.reduceOp = dist.ReduceOp.AVG
        self.pending: list = []  # (start, end, counts a step): CUDA events not yet read
        self.wait = 0.0
        self.steps = 0
        self.since = time.monotonic()

    def arrived(self):
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def reduced(self, mark, step: bool = True) -> None:
        """The collective marked ``mark`` is over (``step``: the step's gradient all-reduce, which counts a step)."""
        if not self.cuda:
            self.wait += time.perf_counter() - mark
            self.steps += step
            return
        import torch

        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.pending.append((mark, end, step))

    def _read_events(self) -> None:
        while self.pending and self.pending[0][1].query():  # passed on the device: read without a sync
            start, end, step = self.pending.pop(0)
            self.wait += start.elapsed_time(end) / 1e3
            self.steps += step

    def take(self) -> dict:
        """``collective_wait_seconds`` (this rank's mean wait per step), ``step_seconds`` (its mean step time) and
        ``collective_steps`` since the last call; {} when no step was timed."""
        self._read_events()
        now = time.monotonic()
        steps, wait, seconds = self.steps, self.wait, now - self.since
        self.wait, self.steps, self.since = 0.0, 0, now
        if not steps:
            return {}
        return {"collective_wait_seconds": wait / steps, "step_seconds": seconds / steps, "collective_steps": steps}


def _first(fut):
    return fut.value()[0]


def _allreduce_timed(watcher: Watcher, bucket):
    """DDP's all-reduce hook (the gradients averaged over the group), timing the step's last bucket. Called for every
    bucket (a 0.9 B model has ~150), so it goes straight to the process group (torch.distributed's wrapper cost an
    H200 step of 215 ms 1 % more than DDP's own all-reduce)."""
    tensor = bucket.buffer()
    if not watcher.average:
        tensor.div_(watcher.size)
    if not bucket.is_last():
        return watcher.group.allreduce([tensor], watcher.opts).get_future().then(_first)
    mark = watcher.arrived()

    def reduced(fut):
        watcher.reduced(mark)
        return fut.value()[0]

    return watcher.group.allreduce([tensor], watcher.opts).get_future().then(reduced)


# The collectives a step may call synchronously besides DDP's (Lightning's per-step SIGTERM broadcast, its
# reduce_boolean_decision, a script's loss all-reduce): each timed as a wait where a watcher is registered.
COLLECTIVES = ("all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor")


def _timed(original):
    """``original`` (a torch.distributed collective) with its synchronous calls' waits added to the watcher's."""
    import functools
    import inspect

    at = list(inspect.signature(original).parameters).index("async_op")

    @functools.wraps(original)
    def timed(*args, **kwargs):
        if not _WATCHER or kwargs.get("async_op", args[at] if len(args) > at else False):
            return original(*args, **kwargs)  # an asynchronous call waits later, where kit does not see
        mark = _WATCHER[0].arrived()
        try:
            return original(*args, **kwargs)
        finally:
            _WATCHER[0].reduced(mark, step=False)

    timed.kit_timed = True
    return timed


def _time_collectives() -> None:
    """Time the step's other synchronous collectives (:data:`COLLECTIVES`). A rank held up in one of them with
    the slow rank (a broadcast passing through it, say) arrives late at the next all-reduce through no fault of its
    own: with every collective's wait counted, the blame stays with the slow rank."""
    import torch.distributed as dist

    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is not None and not getattr(original, "kit_timed", False):
            setattr(dist, name, _timed(original))


def watch(ddp_model) -> Watcher | None:
    """Time this rank's waits at ``ddp_model``'s gradient all-reduce (a torch DistributedDataParallel) and in the
    step's other synchronous collectives; call once, before the first backward pass. None (and nothing registered)
    when the model is not a DDP module or already has a communication hook of its own."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(ddp_model, DistributedDataParallel):
        return None
    watcher = Watcher(cuda=ddp_model.device_type == "cuda", group=ddp_model.process_group)
    try:
        ddp_model.register_comm_hook(watcher, _allreduce_timed)
    except RuntimeError:  # a hook of the user's: theirs stays
        return None
    _WATCHER[:] = [watcher]
    _time_collectives()
    return watcher


def values() -> dict:
    """What the registered watcher measured since the last call ({} when none is registered)."""
    return _WATCHER[0].take() if _WATCHER else {}
