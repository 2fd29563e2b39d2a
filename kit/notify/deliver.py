"""What a job's targets were sent, and sending what they were not: each event exactly once.

The events are the job's timeline (:func:`kit.jobdir.events.events`, read from the records kit writes as things
happen), each named by a key that stays the same however often it is read (``hang:1:0``: run 1's first hang;
``ended``: the job's end, whoever saw it first). The job's ledger, ``notify/sent.jsonl``, holds one line per key and
target once it was sent — or tried :data:`TRIES` times and given up (``ok`` false: ``kit report`` says so). One
sender at a time holds ``notify/lock``: prelaunch's watcher, its last word as the batch script ends (requeued,
ended) and the first kit command that sees the end of a job whose batch script was killed before it could tell.
A dead or slow receiver costs the job nothing: sends are bounded, the last word by a deadline (what it could not
send stays for the next sender), and every failure is recorded, never raised.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path

from kit import files, jobdir
from kit.core.notify import Recipient, parse_all
from kit.jobdir import JobDir, records
from kit.jobdir.events import Event, events
from kit.notify import ledger
from kit.notify import send as sender

# What is told (kit events has more: "submitted", "running", each run's end).
NOTIFIED = (
    *("started", "preflight", "first-step", "warned", "hang", "straggler"),
    *("restarted", "requeued", "stopped", "exited", "ended"),
)
ENDED = ("exited", "ended")  # prelaunch's word on the job's end, or Slurm's: one "ended" is sent, the first seen
TRIES, PAUSE, TIMEOUT = 3, 1.0, 3.0  # per event and target: tries, the pause between them, each one's seconds
LAST_WORD = 5.0  # seconds prelaunch's last word may take at the batch script's end


def targets(job_dir: Path) -> tuple[Recipient, ...]:
    """The job's targets (its spec's ``notify``; an array task's are its array's), () when none or unreadable."""
    spec_dir = records.submission_dir(job_dir)
    try:
        spec = json.loads(jobdir.read_own(spec_dir / JobDir.SPEC, 1 << 22))
        return parse_all(spec.get("notify") or ())
    except Exception:
        return ()


def keyed(timeline: list[Event]) -> list[tuple[str, Event]]:
    """The told events with their keys: ``KIND:RUN:N`` (the run's N-th of that kind), and ``ended`` once."""
    out, seen = [], {}
    for e in timeline:
        if e.kind not in NOTIFIED:
            continue
        if e.kind in ENDED:
            if "ended" not in seen:
                seen["ended"] = 1
                out.append(("ended", e))
            continue
        n = seen.get((e.kind, e.run), 0)
        seen[(e.kind, e.run)] = n + 1
        out.append((f"{e.kind}:{'' if e.run is None else e.run}:{n}", e))
    return out


def message(job_dir: Path, key: str, e: Event) -> dict:
    """The JSON record a webhook gets (and a mail carries): the job, the event, its key (a receiver may dedupe by
    ``job_id`` + ``key``); the end's with the job's goodput where its records give one."""
    out = {
        "job_id": records.job_id_of(job_dir),
        "job_name": records.job_name(records.submission_dir(job_dir)),
        "job_dir": str(job_dir),
        "user": _user(),
        "key": key,
        "event": "ended" if key == "ended" else e.kind,
        "text": e.text,
        "time": e.time,
        "run": e.run,
    }
    if e.kind == "exited":
        from kit.core.outcome import MEANING, command_failed

        code = out["exit_code"] = files.read_json(JobDir(job_dir).run_progress(e.run) / JobDir.EXITED)["code"]
        meaning = "the work finished" if code == 0 else MEANING.get(code) or command_failed(code)
        out["text"] = f"ended: {meaning} (exit code {code})"
    if key == "ended":
        _the_end(job_dir, out)
    return out


def _the_end(job_dir: Path, out: dict) -> None:
    """The end's message with the job's goodput, throughput and duration (kit.jobdir.tally: every surface's)."""
    from kit.jobdir.goodput import goodput
    from kit.jobdir.tally import tally

    try:
        g = goodput(job_dir, running=False)
        counted = tally(job_dir, spent=g)
    except Exception:  # a damaged record costs these lines, never the message
        g = counted = None
    if g is not None:
        out["goodput"] = g.goodput
        out["goodput_line"] = g.line()
    if counted is not None:
        out.update(counted.as_json())
        if counted.words() not in out["text"]:  # Slurm's end (kit.jobdir.events) says them already
            out["text"] += f"; {counted.words()}"


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


def _lock(job_dir: Path, deadline: float):
    d = Path(job_dir) / JobDir.NOTIFY
    d.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(d / JobDir.NOTIFY_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.time() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.1)


def deliver(job_dir: str | Path, deadline: float = float("inf"), stop=lambda: False) -> int:
    """Send every told event not yet in the ledger to every target until ``deadline`` (Unix seconds: what is left
    stays for the next sender) or ``stop()``; the number of sends recorded. The targets side by side, each in its
    own thread taking the events in order: a silent receiver costs its own sends, never another target's."""
    job_dir = Path(job_dir)
    to = targets(job_dir)
    if not to:
        return 0
    fd = _lock(job_dir, deadline)
    if fd is None:
        return 0
    try:
        done = {(r["key"], r["target"]) for r in ledger.read(job_dir)}
        ready = [e for e in events(job_dir) if not e.pending]  # a later run's start: once its nodes are known
        told = [(key, e) for key, e in keyed(ready) if any((key, i) not in done for i in range(len(to)))]
        messages = {key: _told(job_dir, key, e) for key, e in told}
        lock, count = threading.Lock(), [0]

        def to_one(i: int, target: Recipient) -> None:
            for key, msg in messages.items():  # in the timeline's order
                if (key, i) in done:
                    continue
                if stop() or time.time() >= deadline:
                    return
                sent, error = _send(target, msg, deadline, stop) if isinstance(msg, dict) else (True, msg)
                if not sent:  # stopped, or out of time: the next sender tries again
                    return
                with lock:
                    ledger.record(job_dir, key, i, target, error)
                    count[0] += 1

        senders = [threading.Thread(target=to_one, args=(i, t), daemon=True) for i, t in enumerate(to)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        return count[0]
    finally:
        os.close(fd)


def _told(job_dir: Path, key: str, e: Event) -> dict | str:
    """The event's message, made once for every target; for a damaged record, why it cannot be told (recorded as
    each send's failure, never a traceback)."""
    try:
        return message(job_dir, key, e)
    except Exception as err:
        return f"the event could not be told: {type(err).__name__}: {err}"


def _send(target: Recipient, msg: dict, deadline: float, stop) -> tuple[bool, str | None]:
    """Up to TRIES tries, each within the deadline, again only where it cannot have arrived (refused, 5xx): (True,
    None) when one arrived, (True, the error) when it failed for good — any exception a send raises is its
    failure, recorded, never the job's end — (False, None) when stopped or out of time first (nothing to record)."""
    error = None
    for attempt in range(TRIES):
        left = deadline - time.time()
        if left < 1.0 or (attempt and stop()):
            return False, None
        try:
            sender.send(target, msg, min(TIMEOUT, left))
            return True, None
        except sender.Retryable as e:
            error = str(e)
        except OSError as e:
            return True, str(e)
        except Exception as e:  # a receiver's or library's surprise: this send's failure
            return True, f"{type(e).__name__}: {e}"
        if attempt + 1 < TRIES:
            time.sleep(min(PAUSE, max(deadline - time.time(), 0)))
    return True, error


def watch(job_dir: str | Path, stop, every: float = 1.0) -> None:
    """Prelaunch's watcher: send what happens, every ``every`` seconds, until ``stop()``."""
    while not stop():
        deliver(job_dir, stop=stop)
        end = time.time() + every
        while not stop() and time.time() < end:
            time.sleep(0.1)


def last_word(job_dir: str | Path, seconds: float = LAST_WORD) -> int:
    """What is not yet sent, within ``seconds`` (prelaunch's end: requeued, restarted, ended)."""
    return deliver(job_dir, time.time() + seconds)


def pending(job_dir: str | Path) -> bool:
    """Whether an ended job (its batch script's last word, or Slurm's end kept) has a target its end was never told
    to (the batch script was killed, or its last word ran out of time): its ledger's ``ended`` lines against its
    targets, nothing sent."""
    job_dir = Path(job_dir)
    to = targets(job_dir)
    d = JobDir(job_dir)
    ended = (d / JobDir.OUTCOME).exists() or any(
        (d.run_progress(r) / JobDir.EXITED).exists() for r in d.run_dirs(JobDir.PROGRESS)
    )
    if not to or not ended:
        return False
    told = {r["target"] for r in ledger.read(job_dir) if r["key"] == "ended"}
    return not told.issuperset(range(len(to)))


def tell_pending(job_dirs) -> None:
    """`kit ps`, `kit events` and `kit report` having seen these jobs: an ended one's untold events are handed to a
    sender of their own (``python -m kit.notify last``, detached: the command does not wait on a receiver), which
    sends each once (the ledger, under its lock)."""
    import subprocess
    import sys

    for job_dir in job_dirs:
        if pending(job_dir):
            subprocess.Popen(
                [sys.executable, "-m", "kit.notify", "last", str(job_dir)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )


def catch_up(job_dir: str | Path) -> None:
    """After a kit command saw the job end: send what its batch script could not (it was killed), once."""
    if targets(Path(job_dir)):
        last_word(job_dir)
