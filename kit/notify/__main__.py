"""``python -m kit.notify watch|last JOB_DIR``: prelaunch's notification watcher, and its last word.

``watch`` sends the job's events as they happen until TERM (a send under way is finished first: it is bounded);
``last`` sends what is left within a few seconds and exits. Neither ever fails the job: errors are recorded in the
job's ``notify/sent.jsonl``, and the exit status is 0.
"""

from __future__ import annotations

import signal
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("watch", "last"):
        print("usage: python -m kit.notify watch|last JOB_DIR", file=sys.stderr)
        return 2
    from kit.notify import deliver

    if argv[0] == "last":
        deliver.last_word(argv[1])
        return 0
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    deliver.watch(argv[1], stop=lambda: bool(stopping))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
