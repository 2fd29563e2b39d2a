"""The warning signal, caught from the first moment of the process.

``python -m kit.train`` installs this before importing torch and Lightning
(seconds of imports); the launcher delivers the warning only once the
process catches it, so catching it early makes the delivery prompt.
"""

from __future__ import annotations

import os
import signal

_requested = False


def _handler(signum, frame):
    global _requested
    _requested = True


def signal_number() -> int:
    return int(getattr(signal, "SIG" + os.environ.get("KIT_WARNING_SIGNAL", "USR1")))


def install() -> None:
    signal.signal(signal_number(), _handler)


def requested() -> bool:
    return _requested
