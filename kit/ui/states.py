"""Slurm's states for `kit ui`'s pages, asked in the background: a page shows what Slurm said at most a few seconds
ago and never waits for it (a loaded controller answers a squeue in 100 ms or more), and however many pages are
open, each Slurm is asked once every :data:`EVERY` seconds, for the jobs a page showed in the last :data:`KEEP`."""

from __future__ import annotations

import threading
import time

from kit import slurm
from kit.errors import KitError

EVERY = 2.0  # seconds between two asks of each Slurm, in the background
FRESH = 3 * EVERY  # an answer older than this (the background asks failing) is asked again, the page waiting
KEEP = 60.0  # seconds a job stays asked for after a page last showed it


class States:
    """A stand-in for :func:`kit.slurm.statuses` (``list_jobs``'s ``ask``) that answers from what it last heard."""

    def __init__(self, ask=slurm.statuses):
        self.ask = ask
        self._lock = threading.Lock()
        self._known: dict[tuple, tuple[float, slurm.JobStatus | None]] = {}  # (target, name) -> (when, state)
        self._wanted: dict[tuple, float] = {}  # (target, name) -> when a page last showed it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, target: slurm.Target, names: list[str]) -> dict[str, slurm.JobStatus]:
        now = time.monotonic()
        with self._lock:
            self._wanted.update({(target, n): now for n in names})
            known = [self._known.get((target, n)) for n in names]
            if self._thread is None:
                self._thread = threading.Thread(target=self._refresh, args=(self._stop,), name="kit-ui-slurm",
                                                daemon=True)  # fmt: skip
                self._thread.start()
        if all(k is not None and now - k[0] <= FRESH for k in known):
            return {n: k[1] for n, k in zip(names, known) if k[1] is not None}
        return self._asked(target, names)  # the first look (or the background failing): waited for

    def _asked(self, target: slurm.Target, names: list[str]) -> dict[str, slurm.JobStatus]:
        found = self.ask(target, names)  # a KitError is the caller's: the rows say Slurm's problem
        at = time.monotonic()
        with self._lock:
            self._known.update({(target, n): (at, found.get(n)) for n in names})
        return found

    def _refresh(self, stop: threading.Event) -> None:
        while not stop.wait(EVERY):
            now = time.monotonic()
            by_target: dict[slurm.Target, list[str]] = {}
            with self._lock:
                for key in [k for k, t in self._wanted.items() if now - t > KEEP]:
                    del self._wanted[key]
                    self._known.pop(key, None)
                for target, name in self._wanted:
                    by_target.setdefault(target, []).append(name)
            for target, names in by_target.items():
                try:
                    self._asked(target, names)
                except KitError:
                    pass  # its answers grow old: the next page asks and shows the problem

    def close(self) -> None:
        """Stop asking in the background (a later look starts again)."""
        with self._lock:
            thread, stop, self._thread, self._stop = self._thread, self._stop, None, threading.Event()
        stop.set()
        if thread is not None:
            thread.join(10)
