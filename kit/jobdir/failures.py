"""How the ranks of a run ended, and which failure came first: the launchers' exit records
(``logs/exit.r<run>.rank-<R>``), the end of the failing rank's log, and under a per-node
launcher (torchrun) the child its root-cause record names."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kit import files
from kit.jobdir.layout import JobDir
from kit.jobdir.records import node_of


@dataclass
class RankEnd:
    run: int
    rank: int
    node: str
    exit_code: int
    time: float
    by_itself: bool  # False: it was stopped (a signal from kit or Slurm)


def rank_ends(job_dir: Path, run: int) -> list[RankEnd]:
    """How each rank of a run ended (``logs/exit.r<run>.rank-<R>``: time rank rc self|stopped), by time."""
    out = []
    for p in JobDir(job_dir).exit_records(run):
        try:
            t, rank, rc, how = files.read_text(p, 4096).split()[:4]
            out.append(RankEnd(run, int(rank), node_of(job_dir, run, int(rank)), int(rc), int(t) / 1e9, how == "self"))
        except (OSError, ValueError, OverflowError):
            continue
    return sorted(out, key=lambda e: (e.time, e.rank))


def first_failure(job_dir: Path, run: int) -> RankEnd | None:
    """The first rank of a run that failed by itself (non-zero, not stopped)."""
    return next((e for e in rank_ends(job_dir, run) if e.by_itself and e.exit_code != 0), None)


@dataclass(frozen=True)
class Failure:
    """The failure that came first in a run: the rank's end, the end of its log (a traceback
    kept whole) and, under a per-node launcher, which of its children it was (else None)."""

    end: RankEnd
    text: str
    child: str | None = None

    def headline(self) -> str:
        if self.child:
            return f"{self.child} failed first; its launcher was rank {self.end.rank}"
        return f"rank {self.end.rank} on {self.end.node} failed first, exit code {self.end.exit_code}"


def failure_tail(job_dir: Path, run: int) -> Failure | None:
    """The first failure of a run (its log's last 256 KiB read: a rank's log may be gigabytes).
    Under torchrun its children's root causes decide: the one whose error is not another's
    crash (a closed connection), the earliest first."""
    first = first_failure(job_dir, run)
    if first is None:
        return None
    causes = []
    for e in rank_ends(job_dir, run):
        if e.by_itself and e.exit_code != 0:
            text = _log_tail(job_dir, e.rank, run)
            for cause in root_causes(text):
                own = child_output(text, cause["rank"])  # prefixed once its process group is up
                child = last_lines(own or text)
                causes.append((bool(VICTIM.search(child)), cause["time"], e.time, e, cause, child))
    if causes:
        _, _, _, e, cause, child = min(causes, key=lambda c: c[:3])
        return Failure(
            e,
            child,
            f"rank {cause['rank']} (local rank {cause['local_rank']}) on {e.node}, exit code "
            f"{cause['exitcode']} (torchrun's root cause)",
        )
    return Failure(first, last_lines(_log_tail(job_dir, first.rank, run)))


def _log_tail(job_dir: Path, rank: int, run: int) -> str:
    try:
        return files.tail(JobDir(job_dir).rank_log(rank, run), 256 << 10).decode(errors="replace")
    except OSError:
        return "(its log is gone)"


_LAUNCHER_ERROR = ("ChildFailedError",)  # torchrun's (torch.distributed.elastic)


def last_lines(text: str, lines: int = 20) -> str:
    """The end of a log, a Python traceback near the end kept whole. A per-node launcher's
    own traceback (torchrun's ChildFailedError) is not the error: the child's traceback
    before it is where the end starts then."""
    rows = text.splitlines()
    start = max(len(rows) - lines, 0)
    starts = [i for i in range(max(len(rows) - 400, 0), len(rows)) if "Traceback (most recent call last):" in rows[i]]
    if starts:
        ends = starts[1:] + [len(rows)]
        own = [i for i, end in zip(starts, ends) if not any(m in r for r in rows[i:end] for m in _LAUNCHER_ERROR)]
        pick = starts[-1]
        if own and any(m in r for r in rows[pick:] for m in _LAUNCHER_ERROR):
            pick = own[-1]
        start = min(start, pick)
    return "\n".join(rows[start:])


# A per-node launcher's report of its children (torchrun's ChildFailedError).
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):\n\[\d+\]:\n((?:  [^\n]*\n?)+)")
# What a rank that fails because another died says (the others' errors, not the cause).
VICTIM = re.compile(
    r"Connection closed by peer|Connection reset by peer|remote worker crashing|"
    r"communicator was aborted|Socket Timeout|ProcessGroupNCCL.*(abort|timed? ?out)",
    re.I,
)


def root_causes(text: str) -> list[dict]:
    """torchrun's "Root Cause (first observed failure)" records in a log: ``rank``, ``local_rank``,
    ``exitcode`` and ``time`` of the child that failed first on that node."""
    out = []
    for m in _ROOT_CAUSE.finditer(text):
        fields = dict(re.findall(r"^  (\w+)\s*: (.*?)\s*$", m.group(1), re.M))
        rank = re.match(r"(\d+) \(local_rank: (\d+)\)", fields.get("rank", ""))
        if rank:
            out.append(
                {
                    "rank": int(rank.group(1)),
                    "local_rank": int(rank.group(2)),
                    "exitcode": fields.get("exitcode", "?").split(" (")[0],
                    "time": fields.get("time", ""),
                }
            )
    return out


def child_output(text: str, rank: int) -> str:
    """A torchrun child's lines in its node's log (torchrun prefixes them ``[rank<N>]:``), unprefixed."""
    prefix = f"[rank{rank}]:"
    return "\n".join(line[len(prefix) :].removeprefix(" ") for line in text.splitlines() if line.startswith(prefix))
