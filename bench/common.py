"""What the benches share (run as scripts: `python bench/NAME.py` puts this directory on sys.path)."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float, poll: float = 0.05):
    """Poll ``predicate`` until it returns something true (returned), or raise after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout} s")
