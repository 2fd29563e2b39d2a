"""What the benches share (run as scripts: `python bench/NAME.py` puts this directory on sys.path)."""

from __future__ import annotations

import time
from pathlib import Path


def wait_for(predicate, timeout: float, poll: float = 0.05):
    """Poll ``predicate`` until it returns something true (returned), or raise after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout} s")


def tiny_rootfs(where: Path) -> Path:
    """A small root filesystem for --quick runs (a few MiB: text, random bytes, links, a deep path)."""
    import os

    root = where / "tiny-rootfs"
    for sub in ("usr/bin", "usr/lib/python3/site-packages/pkg", "etc", "var/empty"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for i in range(64):
        (root / "usr" / "lib" / "python3" / "site-packages" / "pkg" / f"m{i}.py").write_text(f"VALUE = {i}\n" * 200)
        (root / "usr" / "bin" / f"tool{i}").write_bytes(os.urandom(16 * 1024))
    (root / "etc" / "os-release").write_text('ID=tiny\nNAME="tiny bench root"\n')
    (root / "usr" / "bin" / "link").symlink_to("tool0")
    return root
