"""The sidecars of a job that ended by themselves while their node's command ran (``progress/r<run>/sidecar-<name>.
<node>``: the launcher's record of one's exit code), as every surface says them."""

from __future__ import annotations

from pathlib import Path

from kit import files
from kit.jobdir.failures import rank_ends
from kit.jobdir.layout import JobDir


def sidecar_ends(job_dir: Path) -> list[dict]:
    """Every sidecar that ended by itself while its node's command ran (``progress/r<run>/sidecar-<name>.<node>``;
    one stopped by the teardown, after the command, is not one): ``run``, ``name``, ``node``, ``code`` and ``time``,
    in time order."""
    d, out = JobDir(job_dir), []
    for run in d.run_dirs(JobDir.PROGRESS):
        ended: dict[str, float] = {}  # each node's first rank to end: its teardown follows
        for e in rank_ends(job_dir, run):
            ended.setdefault(e.node, e.time)
        for path in d.run_progress(run).glob(JobDir.SIDECAR_ENDED.format(name="*", node="*")):
            name, _, node = path.name.removeprefix("sidecar-").partition(".")  # a name has no dot; a node may
            try:
                code, when = files.read_text(path, 256).split()[:2]
                if float(when) < ended.get(node, float("inf")):
                    out.append({"run": run, "name": name, "node": node, "code": int(code), "time": float(when)})
            except (OSError, ValueError):
                continue
    return sorted(out, key=lambda e: e["time"])


def sidecar_text(e: dict) -> str:
    """A sidecar's own end as every surface says it."""
    log = JobDir.SIDECAR_LOG.format(node=e["node"], run=e["run"], name=e["name"])
    return f"sidecar {e['name']} on {e['node']} ended by itself with exit code {e['code']} (its log: logs/{log})"
