"""A Python function as a kit job (``kit.submit``): every rank loads the pickled call from its
job directory (``function.pkl``), runs it with the launcher's variables set (RANK, WORLD_SIZE,
MASTER_ADDR, ...: ``torch.distributed.init_process_group`` just works), and leaves its return
value (``results/rank-<R>.pkl``) or its exception (``results/rank-<R>.error.json``: type,
message, traceback, rank, node) for the submitting process. A rank that returned declares its
work finished (kit.train.progress), so FINISHED comes only when every rank returned; a requeued
run calls the function again unless the job had finished.

    python -m kit.train.function      # what every rank of a kit.submit job runs
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import traceback

from kit import files
from kit.jobdir import JobDir
from kit.train import progress


def main() -> int:
    job = JobDir(os.environ.get("KIT_JOB_DIR") or ".")
    rank = int(os.environ.get("RANK", "0"))
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        import cloudpickle
    except ModuleNotFoundError:
        print(
            "kit.train.function: cloudpickle is not installed in this Python (pip install cloudpickle)", file=sys.stderr
        )
        return 2
    with open(job / JobDir.FUNCTION, "rb") as f:
        fn, args, kwargs = pickle.load(f)
    (job / JobDir.RESULTS).mkdir(exist_ok=True)
    try:
        value = fn(*args, **kwargs)
    except BaseException as e:  # noqa: B036 - every way the call ends is told, SystemExit included
        record = {
            "rank": rank,
            "node": node,
            "type": type(e).__name__,
            "message": str(e),
            "traceback": traceback.format_exc(),
        }
        files.write_atomic(job.error(rank), json.dumps(record) + "\n", 0o600)
        traceback.print_exc()
        return 1
    files.write_atomic(job.result(rank), cloudpickle.dumps(value), 0o600)
    progress.finished()
    return 0


if __name__ == "__main__":
    sys.exit(main())
