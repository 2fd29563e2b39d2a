"""Stop signals for the processes that run until told (kit.stopping): a signal that lands at any moment of the
main thread's wait ends it. The pattern it replaces, a handler that sets a threading.Event the main thread waits
on, hung 11 of 20 times with the same loop (the handler waiting for the Event's lock its own thread held)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

LOOP = """
import sys
from kit.stopping import Stop
stop = Stop()
print("ready", flush=True)
while not stop.wait(0):  # the main thread always inside wait(): the signal lands there, at any point of it
    pass
print("stopped by", stop.signum, flush=True)
"""


def test_a_stop_signal_ends_the_wait_whenever_it_lands(tmp_path):
    for _ in range(20):
        proc = subprocess.Popen(
            [sys.executable, "-c", LOOP], stdout=subprocess.PIPE, text=True, cwd=tmp_path, env={"PYTHONPATH": str(REPO)}
        )
        try:
            assert proc.stdout.readline() == "ready\n"
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=5)
        finally:
            proc.kill()
            proc.wait()
        assert out == f"stopped by {int(signal.SIGTERM)}\n" and proc.returncode == 0, out


def test_no_signal_handler_of_kit_sets_an_event():
    """Every process of kit that waits for a stop signal takes it through kit.stopping."""
    handler = re.compile(r"signal\.signal\([^\n]*\.set\(\)")
    bad = [str(p.relative_to(REPO)) for p in sorted((REPO / "kit").rglob("*.py")) if handler.search(p.read_text())]
    assert bad == []
