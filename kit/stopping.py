"""Stop signals for a process that runs until told (the exporter, the checkpoint keeper), caught without a lock.

A Python signal handler runs in the main thread between two bytecodes, wherever that thread is. A handler that
calls ``threading.Event.set()`` while the main thread is inside the same Event's ``wait()`` (it holds the Event's
lock as it wakes from a timeout) waits forever for a lock its own thread holds: an exporter sent TERM hung so
(py-spy: ``Event.set`` in the handler, above ``Condition._acquire_restore``), until the launcher's teardown
killed it, its Prometheus target file left behind. Here the handler only sets a value and writes a byte to a
pipe; :meth:`Stop.wait` sleeps in ``select()`` on that pipe.
"""

from __future__ import annotations

import os
import select
import signal

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stop:
    """Set by the first of ``signals`` (or :meth:`set`), for good; ``wait`` returns as soon as it is."""

    def __init__(self, signals=SIGNALS):
        self.signum: int | None = None
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        for sig in signals:
            signal.signal(sig, self._caught)

    def _caught(self, signum, frame) -> None:
        self.set(signum)

    def set(self, signum: int = 0) -> None:
        if self.signum is None:
            self.signum = signum
        try:
            os.write(self._write, b"x")
        except OSError:  # the pipe is full: it has been said
            pass

    def is_set(self) -> bool:
        return self.signum is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it is set, after at most ``timeout`` seconds (the pipe stays readable once written)."""
        if not self.is_set():
            select.select([self._read], [], [], timeout)
        return self.is_set()
