"""A user's training loop with no handler for the time-limit warning (USR1's
default action would end it): it saves a checkpoint every few steps and tells
kit the step it saved (kit.train.progress), resumes from it after a requeue,
and exits 0 when its work is done.

Its work, for the test: steps until a run after the first has been warned
(kit leaves the warning in $KIT_PROGRESS_DIR/warning), then five more steps:
a run that ends its work by itself after the warning.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from kit.train import progress

EVERY, DELAY = 10, 0.5


def main() -> int:
    rank, restart = int(os.environ["RANK"]), int(os.environ.get("KIT_RESTART", "0"))
    ckpt = Path(os.environ["KIT_JOB_DIR"]) / "checkpoints" / "step"
    step = int(ckpt.read_text()) if ckpt.exists() else 0
    print(f"rank {rank} run {restart}: starting at step {step}", flush=True)
    warning = Path(os.environ["KIT_PROGRESS_DIR"]) / "warning"
    left = None
    while left != 0:
        time.sleep(DELAY)
        step += 1
        progress.step(step)
        if left is None and restart >= 1 and warning.exists():
            left = 5
        elif left:
            left -= 1
        if step % EVERY == 0 and rank == 0:
            ckpt.parent.mkdir(exist_ok=True)
            tmp = ckpt.with_suffix(".tmp")
            tmp.write_text(f"{step}\n")
            os.replace(tmp, ckpt)
            progress.checkpoint_saved(step)
            print(f"rank {rank}: saved step {step}", flush=True)
    print(f"rank {rank} run {restart}: all work done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
