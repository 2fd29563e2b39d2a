"""Where kit keeps its state on this machine (caches, the local cluster, job records)."""

from __future__ import annotations

import os
from pathlib import Path


def kit_home() -> Path:
    """``$KIT_HOME``, else ``$XDG_STATE_HOME/kit``, else ``~/.local/state/kit``."""
    if os.environ.get("KIT_HOME"):
        return Path(os.environ["KIT_HOME"]).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "kit"
