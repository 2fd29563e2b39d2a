"""kit's checkpoints, from a rank: a snapshot of every step held beside the ranks, persisted by the node's keeper.

A plain PyTorch script (docs/trainer.md)::

    from kit.train import checkpoint
    state, step = checkpoint.load()                                   # (None, 0) on a first run
    ...  # after each optimizer step:
    checkpoint.save({"model": model.state_dict(), "optim": opt.state_dict()}, step)

``save`` copies the state into host memory (on a GPU: pinned buffers on a side stream, waited for before the
optimizer next changes the state — :func:`copied`) and writes it to the node's shared memory in the background; the
node's keeper (:mod:`kit.train.keeper`, started here) persists it to the node's disk, the next node and the job
directory on the interval kit chooses. ``load`` resumes every rank from the newest step all of them can load, from
the nearest tier that holds it, and records the tier and the time it took. ``finish`` saves the last state to
every tier. The reference trainer's Lightning pieces are :class:`Snapshots` and :class:`RestoreIO`.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import queue
import subprocess
import sys
import threading
import time

import torch

from kit import files
from kit.jobdir import JobDir
from kit.train import interval, progress
from kit.train import keeper as K
from kit.train import snapshots as S

BLOCKING_TARGET = 0.01  # a snapshot may block at most this share of a step
TELL_AFTER = 100  # snapshots measured before the rank says what they block


def log(msg: str) -> None:
    print(f"kit.train.checkpoint[rank {os.environ.get('RANK', '0')}]: {msg}", flush=True)


class Store:
    """This rank's checkpoints: its node's tiers, its keeper, its pending snapshot."""

    def __init__(self, env=None):
        self.where = S.place(env)
        self._stack = contextlib.ExitStack()
        try:
            self.dirs = self._stack.enter_context(S.node_dirs(self.where, env))
        except files.NotOwned as e:  # planted by another user, or open to others: one message, not a traceback
            raise SystemExit(
                f"kit.train.checkpoint: {e.filename}: {e.strerror}; nothing of it is used. Give a directory of your "
                "own (the reference trainer: --checkpoint-memory DIR / --checkpoint-local DIR) or --no-snapshots"
            ) from None
        self.keeper = self._start_keeper()
        self.queue: queue.Queue = queue.Queue(1)  # the one snapshot being written, by one writer thread
        threading.Thread(target=self._writer, daemon=True, name="kit-snapshot-writer").start()
        self.copy_done = None  # a CUDA event: the snapshot's copy to host memory
        self.error: BaseException | None = None
        self.stride, self.told = 1, False
        self.blocked: list[float] = []
        self.last_save: float | None = None
        self.steps: list[float] = []
        self.plan_read, self.chosen = 0.0, []
        self.marked = 0.0
        self.created = time.time()

    # the keeper
    def _start_keeper(self) -> subprocess.Popen | None:
        """One keeper per node and run: the first rank here to lock ``keeper.r<run>`` starts it, and the keeper
        holds the lock (inherited) while it lives."""
        path = self.dirs[S.MEMORY].parent / f"keeper.r{self.where.run}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            log_path = JobDir(self.where.job_dir).logs / JobDir.SIDECAR_LOG.format(
                node=self.where.node, run=self.where.run, name="keeper"
            )
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as out:
                return subprocess.Popen(
                    [sys.executable, "-m", "kit.train.keeper", "--parent", str(os.getpid())],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    pass_fds=(fd,),
                    start_new_session=True,  # the job's signals reach the ranks, not the keeper's last pass
                )
        finally:
            os.close(fd)

    # saving
    def save(self, state, step: int, final: str | None = None) -> None:
        """Snapshot ``state`` at ``step`` (``final``: "warning" or "end" — persisted to every tier at once). ``state``
        may be a function that makes it: called only on the steps snapshotted, its time counted as the snapshot's."""
        now = time.perf_counter()
        if self.last_save is not None:
            self.steps.append(now - self.last_save)
        self.last_save = now
        if final is None and step % self.stride:
            return
        began = time.perf_counter()
        self.wait()
        host, self.copy_done = to_host(state() if callable(state) else state)
        self.blocked.append(time.perf_counter() - began)
        meta = {"world": self.where.world, "time": time.time(), **({"final": final} if final else {})}
        self.queue.put((host, step, meta))
        self._pace()
        if len(self.blocked) == TELL_AFTER:
            self.tell_blocking()

    def _writer(self) -> None:
        while True:
            item = self.queue.get()
            try:
                self._write(*item)
            finally:
                self.queue.task_done()

    def _write(self, host, step: int, meta: dict) -> None:
        try:
            if self.copy_done is not None:
                self.copy_done.synchronize()
            buffer = io.BytesIO()
            torch.save(host, buffer)
            S.write_shard(self.dirs[S.MEMORY], self.where.rank, step, buffer.getvalue(), **meta)
            self._prune(step)
            if self.where.rank == 0 and time.monotonic() - self.marked >= 1:
                self.marked = time.monotonic()
                progress.checkpoint_saved(step)  # kit's "did this run advance" (prelaunch reads it)
        except BaseException as e:  # the training goes on; the next save says it
            self.error = e

    def _prune(self, step: int) -> None:
        """Keep the newest snapshots, the newest of the ranks' common stride, and those the keeper is due to
        persist (it removes them once it has)."""
        if time.monotonic() - self.plan_read > 5:
            self.plan_read = time.monotonic()
            self.chosen = interval.decisions(self.where)
            self.stride = max(self.stride, self._joint_stride())
        mine = S.shards(self.dirs[S.MEMORY]).get(self.where.rank, {})
        strided = [s for s in mine if s % self.stride == 0]
        keep = set(sorted(mine)[-K.KEEP :]) | set(sorted(strided)[-1:])
        for old in mine:
            if old not in keep and not interval.due(self.chosen, old, bool(mine[old].get("final")))[0]:
                S.remove_shard(self.dirs[S.MEMORY], self.where.rank, old)

    def _joint_stride(self, mine: int = 1) -> int:
        """The ranks' common stride (``checkpoints/stride``: the largest any rank needs), raised to ``mine``."""
        joint = interval.joint_stride(self.where)
        if mine > joint:
            files.write_atomic(self.where.checkpoints / JobDir.CKPT_STRIDE, f"{mine}\n", 0o600)
        return max(joint, mine)

    def copied(self) -> None:
        """Wait for the snapshot's copy to host memory (before the optimizer changes the state again)."""
        if self.copy_done is not None:
            self.copy_done.synchronize()

    def wait(self) -> None:
        """Wait for the pending snapshot's write; raise what it met."""
        self.queue.join()
        if self.error is not None:
            error, self.error = self.error, None
            raise OSError(f"kit.train.checkpoint: the snapshot was not written: {error}") from error

    def _pace(self) -> None:
        """Snapshot less often when a snapshot blocks more than 1 % of a step (and say so once)."""
        if len(self.steps) < 10 or len(self.blocked) < 10:
            return
        step_s = sorted(self.steps[-20:])[len(self.steps[-20:]) // 2]
        block_s = sorted(self.blocked[-20:])[len(self.blocked[-20:]) // 2]
        share = block_s / (step_s * self.stride) if step_s > 0 else 0
        if share > BLOCKING_TARGET:
            need = block_s / (step_s * BLOCKING_TARGET)
            self.stride = self._joint_stride(1 << max(need - 1, 1).__ceil__().bit_length())  # a power of two
            log(
                f"a snapshot blocks {block_s * 1000:.2f} ms of a {step_s * 1000:.2f} ms step "
                f"({100 * share:.1f} % > {100 * BLOCKING_TARGET:.0f} %): snapshotting every {self.stride} steps"
            )
            self.blocked.clear()

    def tell_blocking(self) -> None:
        """One line: what a snapshot blocks of a step (said once :data:`TELL_AFTER` are measured, and at the end)."""
        if (share := self.blocking_share()) is not None:
            log(
                f"snapshots blocked {100 * share / self.stride:.2f} % of a step "
                f"(median of {len(self.blocked)}; every {self.stride} step(s))"
            )

    def blocking_share(self) -> float | None:
        """The median snapshot's blocking time over the median step's (None until measured)."""
        if not self.steps or not self.blocked:
            return None
        step_s = sorted(self.steps)[len(self.steps) // 2]
        return sorted(self.blocked)[len(self.blocked) // 2] / step_s if step_s > 0 else None

    def finish(self, state, step: int, final: str = "end", wait: float = 120) -> bool:
        """The last state (``final``: "end", or "warning": the run stops, the job goes on), to every tier; True
        once the job directory holds this rank's shard of it."""
        self.save(state, step, final=final)
        self.wait()
        self.tell_blocking()
        shard = self.where.checkpoints / JobDir.CKPT_STEP.format(step=step) / f"{S.shard_name(self.where.rank, 0)}.json"
        return bool(S.wait_for(shard.exists, wait, 0.1))

    # loading
    def load(self, map_location="cpu", wait: float = 120):
        """(state, step) of the newest step every rank can load; (None, 0) when there is none."""
        step, sources = self._restore(wait)
        if not step:
            return None, 0
        rank = self.where.rank
        began = time.monotonic()
        source = sources[str(rank)]
        try:
            data, used = self._fetch(step, source, wait)
        except (OSError, ValueError) as e:
            if source[0] == S.SHARED or step not in S.shared_steps(self.where):
                raise
            log(f"step {step} from the {source[0]} tier of {source[1]} failed ({e}): reading the shared tier")
            data, used = self._fetch(step, [S.SHARED, None, None], wait)
        state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=False)
        seconds = time.monotonic() - began
        S.write_json(
            self.where.checkpoints / JobDir.CKPT_LOADED.format(run=self.where.run, rank=rank),
            {
                "rank": rank,
                "step": step,
                "tier": used[0],
                "node": used[1],
                "seconds": round(seconds, 4),
                "bytes": len(data),
            },
        )
        os.environ["KIT_RESUME_STEP"] = str(step)
        log(f"resumed at step {step} from the {used[0]} tier{f' of {used[1]}' if used[1] else ''} in {seconds:.2f} s")
        return state, step

    def _restore(self, wait: float) -> tuple[int, dict]:
        """The run's one decision: the first rank here makes it once every node's keeper has said what it holds."""
        path = self.where.checkpoints / JobDir.CKPT_RESTORE.format(run=self.where.run)
        decided = S.read_json(path) if self.where.slurm else {}  # outside Slurm every start is a run of its own
        if not decided:
            fresh = lambda: {  # noqa: E731  (the nodes whose keeper of this run has spoken since this rank began)
                n
                for n, h in S.held(self.where).items()
                if h.get("run") == self.where.run and h.get("time", 0) >= self.created
            }
            S.wait_for(lambda: set(self.where.nodes) <= fresh(), wait, 0.1)
            holdings, complete = S.held(self.where), S.shared_steps(self.where)
            step, sources = S.choose(self.where, holdings, complete)
            record = {
                "run": self.where.run,
                "step": step,
                "newest_held": S.newest_held(holdings),  # how far the last run got (its ranks' newest snapshot)
                "shared": sorted(complete),  # the steps sealed in the job directory when this run began
                "sources": {str(r): s for r, s in sources.items()},
            }
            path.parent.mkdir(parents=True, exist_ok=True)
            if not self.where.slurm:
                files.write_atomic(path, json.dumps(record), 0o600)
            with contextlib.suppress(FileExistsError):
                files.create(path, json.dumps(record), 0o600)
            decided = S.wait_for(lambda: S.read_json(path), 10)
        return int(decided.get("step", 0)), decided.get("sources", {})

    def _fetch(self, step: int, source: list, wait: float) -> tuple[bytes, list]:
        tier, node, origin = source
        rank = self.where.rank
        if tier == S.SHARED:
            return S.read_shard(self.where.checkpoints / JobDir.CKPT_STEP.format(step=step), rank, 0)[0], source
        if node == self.where.node:
            directory = self.dirs[S.PEER] / origin if tier == S.PEER else self.dirs[tier]
            return S.read_shard(directory, rank, step)[0], source
        address = K.address_of(self.where, node, wait)
        request = {"op": "get", "tier": tier, "from": origin, "rank": rank, "step": step}
        return K.call(address, K.token(self.where), request)[1], source

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.wait()
        self._stack.close()


def to_host(state):
    """``state`` with every tensor copied to host memory (a CUDA tensor: to pinned memory on a side stream; the
    event to wait for is returned beside it). Other values are kept as they are."""
    stream = event = None
    if torch.cuda.is_available():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())

    def copy(value):
        if isinstance(value, torch.Tensor):
            if value.is_cuda:
                with torch.cuda.stream(stream):
                    out = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
                    out.copy_(value.detach(), non_blocking=True)
                return out
            return value.detach().clone()
        if isinstance(value, dict):
            return {k: copy(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(copy(v) for v in value)
        return value

    host = copy(state)
    if stream is not None:
        event = torch.cuda.Event()
        event.record(stream)
    return host, event


_STORE: Store | None = None


def store() -> Store:
    global _STORE
    if _STORE is None:
        _STORE = Store()
    return _STORE


def load(map_location="cpu"):
    return store().load(map_location)


def save(state, step: int, final: str | None = None) -> None:
    store().save(state, step, final)


def finish(state, step: int, final: str = "end") -> bool:
    return store().finish(state, step, final)


def copied() -> None:
    if _STORE is not None:
        _STORE.copied()
